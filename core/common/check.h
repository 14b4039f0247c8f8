// KVSCOPE_CHECK(cond, message): an internal invariant, always checked (Release
// builds included). A broken invariant is a bug in KVScope, not bad input:
// it throws InvariantError, which names the file and line of the check, the
// condition and the message, and which the command line maps to exit 1.
// Bad input keeps throwing InputError (input_error.h), exit 2.
//
// `message` is evaluated only when the check fails, so it may build a string.
#pragma once

#include <stdexcept>
#include <string>

namespace kvscope {

class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void invariant_failed(const char* condition, const std::string& message,
                                   const char* file, int line);

}  // namespace kvscope

#define KVSCOPE_CHECK(cond, message)                                                \
  do {                                                                              \
    if (!(cond)) ::kvscope::invariant_failed(#cond, (message), __FILE__, __LINE__); \
  } while (false)
