// TraceWriter: the only way KVScope writes a trace. The recorder hands it one
// StepData per forward step; the writer buffers, flushes every N steps or T
// seconds, lets SWMR readers follow the file while it grows, and sets
// /run/complete = 1 only in close().
//
// Crash contract: every step whose flush returned is on disk and readable
// after a SIGKILL; /steps is written last in each flush, so a reader never
// sees a step whose events, tokens or occupancy are missing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/trace/types.h"

namespace kvscope::trace {

class TraceWriter {
 public:
  struct Options {
    int64_t flush_every_steps = 16;
    double flush_every_seconds = 2.0;
    int compression_level = 1;  // deflate level with shuffle; 0 stores raw chunks (see docs/performance.md)
    bool swmr = true;           // readers may follow the capture
    // Called after every flush with the number of steps now on disk.
    std::function<void(int64_t)> on_flush;
  };

  // Creates (truncates) `path` with every dataset the layout needs. Throws
  // TraceError on bad run info or an unwritable file.
  static std::unique_ptr<TraceWriter> create(const std::string& path, const RunInfo& run,
                                             const CaptureLayout& layout);
  static std::unique_ptr<TraceWriter> create(const std::string& path, const RunInfo& run,
                                             const CaptureLayout& layout, Options options);

  // An upper bound on the memory a capture of `tokens` tokens needs in the
  // writer and the steps it is handed, fed at most `tokens_per_step` per step:
  // lifetime and gate arrays (every head x token), the events, attention rows
  // and pooled maps of the steps buffered between flushes. Callers check it
  // (check_fits_in_memory) before creating the writer.
  static double estimate_memory_bytes(const RunInfo& run, const CaptureLayout& layout,
                                      int64_t tokens, int64_t tokens_per_step,
                                      const Options& options);

  // Without close(): flushes what it can and leaves complete = 0.
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Appends step number steps_appended(). Events must carry that step number;
  // tokens must continue the token axis. Throws TraceError(Usage) otherwise.
  void append_step(const StepData& step);
  void flush();
  // Flushes everything, finalises lifetimes, writes the summary and marks the
  // trace complete. The writer is unusable afterwards.
  void close(const GenerationSummary& summary);

  int64_t steps_appended() const;
  int64_t steps_on_disk() const;
  int64_t tokens_appended() const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit TraceWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvscope::trace
