#include "core/common/atomic_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "core/common/input_error.h"

namespace kvscope {

void write_stream_atomically(const std::string& path,
                             const std::function<void(std::ostream&)>& body,
                             const std::string& what) {
  // The process id keeps two writers of one target from sharing a temporary.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw InputError(path, "", "cannot write " + what + " (no such directory or no permission?)");
    try {
      body(out);
    } catch (...) {
      out.close();
      std::remove(tmp.c_str());
      throw;
    }
    out.flush();  // a full disk shows here, before the rename
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      throw InputError(path, "", "writing " + what + " failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError(path, "", "cannot replace it with " + what);
  }
}

void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& what) {
  write_stream_atomically(
      path, [&](std::ostream& out) { out.write(bytes.data(), std::streamsize(bytes.size())); },
      what);
}

}  // namespace kvscope
