// Shared pieces of the libFuzzer targets (tests/fuzz, docs/fuzzing.md).
//
// Most parsers take a path, so each input is handed to them as an in-memory
// file: one memfd per process, rewritten for every input and named
// /proc/self/fd/N. Nothing touches the disk, and two fuzzers running side by
// side cannot see each other's inputs. The trace targets need no file: they
// open each input where it lies, as an HDF5 file image
// (TraceReader::open_image, validate_trace_image).
//
// What counts as a finding: anything but a clean return or an InputError
// (which the CLI maps to exit 2). Another exception escaping a parser is a
// bug too (exit 1 for bad input, or a std::bad_alloc that should have been a
// size check), so the targets let it escape and libFuzzer reports it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvscope::fuzz {

class MemFile {
 public:
  explicit MemFile(const char* name);
  ~MemFile();
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the file's content; returns the path that opens it.
  const std::string& write(const uint8_t* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs f; an InputError (the documented answer to bad input) is swallowed
// (printed when KVSCOPE_FUZZ_VERBOSE is set, to see why seeds are refused),
// anything else escapes. Returns whether f returned normally.
template <typename F>
bool accepts(F&& f);

}  // namespace kvscope::fuzz

#include <cstdio>

#include "core/common/input_error.h"

namespace kvscope::fuzz {

bool verbose();

template <typename F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const InputError& e) {
    if (verbose()) std::fprintf(stderr, "InputError: %s\n", e.what());
    return false;
  }
}

}  // namespace kvscope::fuzz
