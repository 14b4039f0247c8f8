#include "core/common/thread_count.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/common/input_error.h"

namespace kvscope {

namespace {

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

int default_thread_count() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr || *env == '\0') return affinity_cpu_count();
  const std::string text(env);
  const std::string first = text.substr(0, text.find(','));
  std::size_t used = 0;
  long n = 0;
  try {
    n = std::stol(first, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != first.size() || n < 1 || n > 4096)
    throw InputError(
        "", "OMP_NUM_THREADS",
        "\"" + text + "\" (expected a positive whole number, or unset for one thread per core)");
  return static_cast<int>(n);
}

}  // namespace kvscope
