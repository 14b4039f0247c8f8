// A trace at a glance: counts by kind, role and step type, read in bounded
// blocks. Shared by `kvscope info` and the GUI's trace info panel.
#pragma once

#include <array>
#include <cstdint>

#include "core/trace/reader.h"

namespace kvscope::analysis {

struct TraceSummary {
  int64_t steps = 0, prefill_steps = 0, decode_steps = 0;
  int64_t reconstruction_steps = 0, reconstruction_tokens = 0;  // a KVzip-style pass (1.5)
  int64_t tokens = 0;
  std::array<int64_t, trace::kTokenRoleCount> tokens_by_role{};
  int64_t events = 0;
  std::array<int64_t, trace::kEventKindCount> events_by_kind{};
  int64_t final_entries = 0;   // cache entries after the last step
  int64_t final_kv_bytes = 0;  // pool bytes after the last step
  int64_t peak_kv_bytes = 0;
  double wall_s = 0;           // sum of step wall times
};

TraceSummary summarize(const trace::TraceReader& reader);

}  // namespace kvscope::analysis
