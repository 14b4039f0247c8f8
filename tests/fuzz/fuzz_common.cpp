#include "tests/fuzz/fuzz_common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvscope::fuzz {

bool verbose() {
  static const bool on = std::getenv("KVSCOPE_FUZZ_VERBOSE") != nullptr;
  return on;
}

MemFile::MemFile(const char* name) {
  fd_ = memfd_create(name, MFD_CLOEXEC);
  path_ = "/proc/self/fd/" + std::to_string(fd_);
  if (fd_ < 0) {
    std::fprintf(stderr, "%s: %s\n", path_.c_str(), std::strerror(errno));
    std::abort();
  }
}

MemFile::~MemFile() {
  if (fd_ >= 0) close(fd_);
}

const std::string& MemFile::write(const uint8_t* data, size_t size) {
  // Shrink first: a parser must never see the tail of a longer previous input.
  if (ftruncate(fd_, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return path_;
}

}  // namespace kvscope::fuzz
