#include "core/common/memory_limit.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "core/common/input_error.h"

namespace kvscope {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return int64_t(16) << 30;  // unknown: assume a 16 GiB machine
  return int64_t(pages) * int64_t(page);
}

int64_t run_memory_limit_bytes() {
  return physical_memory_bytes() / 4 * 3;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

int64_t available_memory_bytes() {
  // Line by line: some lines (HugePages_Total: 0) have no unit.
  std::ifstream in("/proc/meminfo");
  std::string line;
  long long kib = 0;
  while (std::getline(in, line))
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) return int64_t(kib) * 1024;
  return -1;
}

int64_t address_space_limit_bytes() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  return int64_t(limit.rlim_cur);
}

std::string host_memory_situation() {
  const int64_t available = available_memory_bytes();
  std::string out = "this machine has " +
                    (available >= 0 ? format_bytes(double(available)) + " of its " : "") +
                    format_bytes(double(physical_memory_bytes())) +
                    (available >= 0 ? " available" : " of memory");
  if (const int64_t cap = address_space_limit_bytes(); cap >= 0)
    out += "; ulimit -v caps this process at " + format_bytes(double(cap)) + " of address space";
  return out;
}

std::optional<std::string> explain_host_allocation_failure(const std::string& libtorch_message) {
  static const std::regex failure("can't allocate memory: you tried to allocate ([0-9]+) bytes");
  std::smatch m;
  if (!std::regex_search(libtorch_message, m, failure)) return std::nullopt;
  return "out of host memory: LibTorch could not allocate " + format_bytes(std::stod(m[1].str())) +
         " more; " + host_memory_situation() + " (" + kLessMemoryAdvice + ")";
}

void check_fits_in_memory(const std::string& file, const std::string& field, double bytes,
                          const std::string& what) {
  const int64_t limit = run_memory_limit_bytes();
  if (bytes <= double(limit)) return;
  throw InputError(file, field,
                   "needs about " + format_bytes(bytes) + " of memory for " + what +
                       "; one run may use at most " + format_bytes(double(limit)) +
                       " (three quarters of this machine's " +
                       format_bytes(double(physical_memory_bytes())) + ")");
}

}  // namespace kvscope
