// KVSCOPE_CHECK(cond, message): an internal invariant, always checked (Release
// builds included). A broken invariant is a bug in KVScope, not bad input:
// it throws InvariantError, which names the file and line of the check, the
// condition and the message, and which the command line maps to exit 1.
// Bad input keeps throwing InputError (input_error.h), exit 2.
//
// `message` is evaluated only when the check fails, so it may build a string.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

namespace kvscope {

class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws the InvariantError of a failed check. Inline (header-only) so that
// kernels/, which links no core library, checks its preconditions too.
[[noreturn]] inline void invariant_failed(const char* condition, const std::string& message,
                                          const char* file, int line) {
  // The path from the checkout's root: the same text in every build tree.
  const char* rel = std::strstr(file, "/core/");
  for (const char* root : {"/capture/", "/views/", "/app/", "/kernels/", "/tests/"})
    if (const char* p = std::strstr(file, root); p && (!rel || p < rel)) rel = p;
  const std::string where = std::string(rel ? rel + 1 : file) + ":" + std::to_string(line);
  throw InvariantError(where + ": internal invariant (" + condition + ") broken: " + message);
}

}  // namespace kvscope

#define KVSCOPE_CHECK(cond, message)                                                \
  do {                                                                              \
    if (!(cond)) ::kvscope::invariant_failed(#cond, (message), __FILE__, __LINE__); \
  } while (false)
