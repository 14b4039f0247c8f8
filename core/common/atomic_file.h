// Whole-file writes a reader never sees half of: the bytes go to a temporary
// file beside the target, are flushed, and the temporary is renamed over the
// target (atomic on POSIX within one file system). A failed write (disk full,
// no permission, or the body throwing) removes the temporary and throws
// (InputError naming the target when the stream failed), so no half-written
// file is ever passed off as complete.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace kvscope {

// `body` writes the file into the stream; `what` says what the file is in the
// error ("the budget curve").
void write_stream_atomically(const std::string& path,
                             const std::function<void(std::ostream&)>& body,
                             const std::string& what = "the file");

// The same for bytes at hand.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::string& what = "the file");

}  // namespace kvscope
