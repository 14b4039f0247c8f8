#include <catch2/catch.hpp>
#include <string>

#include "core/common/check.h"
#include "core/common/input_error.h"

namespace {

int evaluations = 0;
std::string counted(const std::string& s) {
  ++evaluations;
  return s;
}

}  // namespace

TEST_CASE("KVSCOPE_CHECK passes a holding invariant without building its message", "[check]") {
  evaluations = 0;
  const int held = 3;
  KVSCOPE_CHECK(held == 3, counted("never built"));
  CHECK(evaluations == 0);
}

TEST_CASE("KVSCOPE_CHECK names the file, line, condition and message of a broken invariant",
          "[check]") {
  const int held = 3;
  const int line = __LINE__ + 2;
  try {
    KVSCOPE_CHECK(held < 2, "held " + std::to_string(held) + " entries");
    FAIL("no throw");
  } catch (const kvscope::InvariantError& e) {
    const std::string what = e.what();
    CHECK(what == "tests/core/test_check.cpp:" + std::to_string(line) +
                      ": internal invariant (held < 2) broken: held 3 entries");
  }
}

TEST_CASE("a broken invariant is no input error", "[check]") {
  bool input_error = false, invariant = false;
  try {
    KVSCOPE_CHECK(false, "x");
  } catch (const kvscope::InputError&) {
    input_error = true;
  } catch (const std::logic_error&) {
    invariant = true;
  }
  CHECK_FALSE(input_error);
  CHECK(invariant);
}
