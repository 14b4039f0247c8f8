// What an out-of-memory error says (core/common/memory_limit.h): LibTorch's
// CPU allocator message read into what was asked and what is there, the
// address-space cap named, sizes in readable units. The whole path (a real
// capture under a cap) runs in tests/cli/host_memory_test.py.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "core/common/memory_limit.h"

using namespace kvscope;

namespace {

// VmSize of /proc/self/status: the address space this process maps now.
int64_t mapped_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmSize:") {
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("memory: sizes read in binary units") {
  CHECK(format_bytes(512) == "512 bytes");
  CHECK(format_bytes(3538944) == "3.4 MiB");
  CHECK(format_bytes(double(int64_t(3) << 30)) == "3.0 GiB");
}

TEST_CASE("memory: LibTorch's allocator failure says what was asked and what is there") {
  // The text pip torch 2.x raises (alloc_cpu.cpp), backtrace already cut.
  const std::string raw =
      "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
      "you tried to allocate 3538944 bytes. Error code 12 (Cannot allocate memory)";
  const std::optional<std::string> said = explain_host_allocation_failure(raw);
  REQUIRE(said);
  CHECK(said->rfind("out of host memory: LibTorch could not allocate 3.4 MiB more; this machine "
                    "has ",
                    0) == 0);
  CHECK(said->find(format_bytes(double(physical_memory_bytes()))) != std::string::npos);
  CHECK(said->find("enforce fail") == std::string::npos);
  // Anything else keeps LibTorch's own words.
  CHECK_FALSE(explain_host_allocation_failure("CUDA out of memory. Tried to allocate 2.00 GiB"));
  CHECK_FALSE(explain_host_allocation_failure("mat1 and mat2 shapes cannot be multiplied"));
}

TEST_CASE("memory: an address-space cap (ulimit -v) is named") {
  struct rlimit before {};
  REQUIRE(getrlimit(RLIMIT_AS, &before) == 0);
  if (before.rlim_max != RLIM_INFINITY) {
    WARN("RLIMIT_AS has a hard limit here: the cap is not raised and lowered");
    return;
  }
  // 1 TiB above what this process maps already (ASan's shadow is terabytes),
  // so nothing it does while capped can fail.
  const rlim_t cap = rlim_t(mapped_bytes()) + (rlim_t(1) << 40);
  struct rlimit capped = before;
  capped.rlim_cur = cap;
  REQUIRE(setrlimit(RLIMIT_AS, &capped) == 0);
  const int64_t seen = address_space_limit_bytes();
  const std::string situation = host_memory_situation();
  REQUIRE(setrlimit(RLIMIT_AS, &before) == 0);
  CHECK(seen == int64_t(cap));
  CHECK(situation.find("; ulimit -v caps this process at " + format_bytes(double(cap)) +
                       " of address space") != std::string::npos);
  CHECK(address_space_limit_bytes() == -1);  // uncapped again
  CHECK(available_memory_bytes() > 0);       // Linux: /proc/meminfo's MemAvailable
  CHECK(available_memory_bytes() <= physical_memory_bytes());
}
