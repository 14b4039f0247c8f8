// Opening a trace file and reading its /run description: shared by the
// reader (which throws the first problem) and the validator (which lists
// them all). Internal to core/trace.
#pragma once

#include <string>
#include <vector>

#include "core/trace/error.h"
#include "core/trace/h5.h"
#include "core/trace/types.h"

namespace kvscope::trace {

struct Problem {
  ErrorCode code;
  std::string field;
  std::string message;
};

// Limits a reader enforces before trusting any size in a file.
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxTokens = int64_t(1) << 26;
inline constexpr int64_t kMaxTiers = 16;
inline constexpr int64_t kMaxReasons = 65535;
inline constexpr int64_t kMaxGates = 64;
inline constexpr int64_t kMaxSeries = 64;
inline constexpr int64_t kMaxDenseHeads = 4096;
inline constexpr int64_t kMaxTopK = 1024;
inline constexpr int64_t kMaxHeadDim = 65536;
inline constexpr int64_t kMaxVocab = int64_t(1) << 31;

// Metadata read attempts when following a trace in SWMR mode: HDF5 sleeps
// 2^i ns before attempt i, so 24 attempts wait at most ~33 ms per object
// (a torn read of metadata the writer is updating resolves far sooner).
inline constexpr unsigned kSwmrReadAttempts = 24;

struct OpenedTrace {
  h5::Handle file;
  bool swmr = false;  // opened in SWMR-read mode (a writer holds, or held, the file)
  int64_t version = 0;
  int64_t minor_version = 0;
  std::string writer;
};

// Opens read-only and checks format and version. Complete traces open
// plainly; a trace a writer holds in SWMR mode (a capture in progress, or one
// killed) opens in SWMR-read mode with bounded metadata retries.
// Throws TraceError: Io, NotATrace, TooNew, TooOld.
OpenedTrace open_trace_file(const std::string& path);
// The same for a file image in memory (`name` in messages): `data` must
// outlive the returned file.
OpenedTrace open_trace_image(const std::string& name, const void* data, size_t size);

// Reads /run and the capture layout. Appends every problem found; the result
// is only meaningful when no problem was added.
void read_run_info(hid_t file, RunInfo* run, CaptureLayout* layout, std::vector<Problem>* problems);

}  // namespace kvscope::trace
