// Token lifetimes as Chrome trace-event JSON, which Perfetto UI and
// chrome://tracing open: the policy and layer are a process, each kv head a
// thread, one step is one millisecond of trace time, each token's residence
// (per tier in tiered traces) is an async begin/end pair, and each head's
// occupancy is a counter track.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/trace/reader.h"

namespace kvscope::analysis {

struct PerfettoOptions {
  std::vector<int> layers;  // empty: all layers
  int64_t token_begin = 0, token_end = -1;
  bool counters = true;
};

// Writes the JSON object to `out` (streamed: size follows the trace, memory
// does not). Returns the number of trace events written.
int64_t write_perfetto_json(const trace::TraceReader& reader, const PerfettoOptions& options,
                            std::ostream& out);

}  // namespace kvscope::analysis
