// What a failed run says, in one line, wherever a failure is reported: the
// command line's exit message and a sweep cell's `error` column.
#pragma once

#include <exception>
#include <string>

namespace kvscope::generate {

// LibTorch's message without the C++ backtrace it appends; its allocators
// running out (host or device) said with what was asked and what is there;
// any other exception's what().
std::string failure_text(const std::exception& e);

}  // namespace kvscope::generate
