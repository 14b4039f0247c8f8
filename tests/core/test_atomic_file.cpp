// core/common/atomic_file: a file appears whole or not at all, and a failed
// write leaves neither a half-written target nor a temporary beside it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/common/atomic_file.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"

namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

}  // namespace

TEST_CASE("an atomic write replaces the target whole, a failed one leaves the old file alone",
          "[core][atomic_file]") {
  const std::string dir = kvscope::test::temp_dir(), path = dir + "/out.bin";
  kvscope::write_file_atomically(path, "first");
  CHECK(read_all(path) == "first");
  kvscope::write_stream_atomically(path, [](std::ostream& out) { out << "second " << 2; });
  CHECK(read_all(path) == "second 2");
  CHECK(entries(dir) == 1);  // no temporary left beside it

  // The body throws halfway: the exception reaches the caller, the target
  // keeps its old bytes and the temporary is gone.
  CHECK_THROWS_WITH(kvscope::write_stream_atomically(path,
                                                     [](std::ostream& out) {
                                                       out << "half";
                                                       throw std::runtime_error("stopped");
                                                     }),
                    "stopped");
  CHECK(read_all(path) == "second 2");
  CHECK(entries(dir) == 1);

  // No directory to write in: an InputError naming the target and what it is.
  const std::string nowhere = dir + "/missing/out.bin";
  try {
    kvscope::write_file_atomically(nowhere, "x", "the budget curve");
    FAIL("expected an InputError");
  } catch (const kvscope::InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains(nowhere) && Catch::Contains("the budget curve"));
  }
  CHECK(!fs::exists(nowhere));
}
