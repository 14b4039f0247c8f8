#include "core/analysis/summary.h"

#include <algorithm>

namespace kvscope::analysis {

namespace {
constexpr int64_t kBlock = 1 << 16;
}

TraceSummary summarize(const trace::TraceReader& reader) {
  TraceSummary s;
  s.steps = reader.n_steps();
  s.tokens = reader.n_tokens();
  s.events = reader.n_events();
  for (int64_t b = 0; b < s.steps; b += kBlock) {
    for (const trace::StepRecord& st : reader.steps(b, std::min(s.steps, b + kBlock))) {
      (st.kind == trace::StepKind::Prefill          ? s.prefill_steps
       : st.kind == trace::StepKind::Reconstruction ? s.reconstruction_steps
                                                    : s.decode_steps)++;
      s.wall_s += st.wall_s;
      s.peak_kv_bytes = std::max(s.peak_kv_bytes, st.kv_bytes);
      s.final_entries = st.entries;
      s.final_kv_bytes = st.kv_bytes;
    }
  }
  s.reconstruction_tokens = reader.n_reconstruction_tokens();
  for (int64_t b = 0; b < s.tokens; b += kBlock)
    for (uint8_t role : reader.token_roles(b, std::min(s.tokens, b + kBlock)))
      if (role < trace::kTokenRoleCount) ++s.tokens_by_role[role];
  for (int64_t b = 0; b < s.events; b += kBlock)
    for (uint8_t kind : reader.event_kinds(b, std::min(s.events, b + kBlock)))
      if (kind < trace::kEventKindCount) ++s.events_by_kind[kind];
  return s;
}

}  // namespace kvscope::analysis
