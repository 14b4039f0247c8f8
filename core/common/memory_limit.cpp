#include "core/common/memory_limit.h"

#include <unistd.h>

#include <cstdio>

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
