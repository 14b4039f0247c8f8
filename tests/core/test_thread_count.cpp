// What --threads 0 means (core/common/thread_count.h): OMP_NUM_THREADS when
// set, else the CPUs in the affinity mask; a malformed value is refused by
// name.
#include <sched.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/common/input_error.h"
#include "core/common/thread_count.h"

using namespace kvscope;

namespace {

// Sets OMP_NUM_THREADS (nullopt: unsets it) for one scope, then puts back
// what the test runner gave.
class OmpNumThreads {
 public:
  explicit OmpNumThreads(std::optional<std::string> value) {
    if (const char* old = std::getenv("OMP_NUM_THREADS")) saved_ = old;
    if (value)
      setenv("OMP_NUM_THREADS", value->c_str(), 1);
    else
      unsetenv("OMP_NUM_THREADS");
  }
  ~OmpNumThreads() {
    if (saved_)
      setenv("OMP_NUM_THREADS", saved_->c_str(), 1);
    else
      unsetenv("OMP_NUM_THREADS");
  }

 private:
  std::optional<std::string> saved_;
};

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  return CPU_COUNT(&set);
}

}  // namespace

TEST_CASE("threads: OMP_NUM_THREADS sets the default, its first level when a list") {
  {
    OmpNumThreads env("3");
    CHECK(default_thread_count() == 3);
  }
  {
    OmpNumThreads env("2,1");
    CHECK(default_thread_count() == 2);
  }
}

TEST_CASE("threads: unset or empty, the default is the CPUs this process may run on") {
  {
    OmpNumThreads env(std::nullopt);
    CHECK(default_thread_count() == affinity_cpus());
  }
  {
    OmpNumThreads env("");
    CHECK(default_thread_count() == affinity_cpus());
  }
}

TEST_CASE("threads: a malformed OMP_NUM_THREADS is refused by name") {
  for (const char* bad : {"zero", "0", "-2", "4x", "1.5"}) {
    OmpNumThreads env{std::string(bad)};
    INFO(bad);
    try {
      (void)default_thread_count();
      FAIL("accepted OMP_NUM_THREADS=" << bad);
    } catch (const InputError& e) {
      CHECK(e.field() == "OMP_NUM_THREADS");
      CHECK(std::string(e.what()).find(std::string("\"") + bad + "\"") != std::string::npos);
    }
  }
}
