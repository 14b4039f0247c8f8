// The one exception type of core/trace. Every message names the file, the
// field (dataset or attribute path) and what was expected, so a user can act
// on it without reading the source.
#pragma once

#include <string>

#include "core/common/input_error.h"

namespace kvscope::trace {

enum class ErrorCode {
  Io,         // cannot open / read / write the file at all
  NotATrace,  // HDF5 but not a KVScope trace, or not HDF5 at all
  TooNew,     // written by a newer format major version
  TooOld,     // written by a format version this build no longer reads
  Schema,     // a dataset or attribute is missing, mistyped or mis-shaped
  TooLarge,   // a size beyond the reader's limits (refused, never allocated)
  Usage,      // the caller asked for something out of range
};

const char* error_code_name(ErrorCode code);

class TraceError : public InputError {
 public:
  TraceError(ErrorCode code, std::string file, std::string field, const std::string& what)
      : InputError(std::move(file), std::move(field), what), code_(code) {}

  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace kvscope::trace
