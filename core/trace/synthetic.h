// Synthetic traces with known content, written through the real TraceWriter.
// Tests use them to check that a value written is a value read; the GUI and
// the benchmarks use them to exercise sizes no tiny model reaches.
//
// The "policy" is StreamingLLM-like and per head: head (l, k) keeps `sinks`
// first tokens and a recent window of window_of(l, k) tokens. With two tiers
// a token leaving the window is demoted to tier 1 ("cold") and evicted
// `window` steps later, so tier moves appear too. With cold_attended = false
// tier 1 is an offloaded tier: attention does not read it, and some decode
// steps stall on a fetch of one of its tokens (/stalls).
#pragma once

#include <cstdint>
#include <string>

#include "core/trace/types.h"
#include "core/trace/writer.h"

namespace kvscope::trace {

struct SyntheticSpec {
  int64_t layers = 4;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t prompt_tokens = 48;
  int64_t decode_steps = 32;
  int64_t prefill_chunk = 0;  // 0: the whole prompt in one step
  int64_t sinks = 4;
  int64_t window = 16;
  int64_t tiers = 1;  // 1 or 2
  // tiers = 2: false marks tier 1 not attended (/run tier_attended = [1, 0]):
  // attention skips its tokens and decode steps stall on some of them.
  bool cold_attended = true;
  bool received = true;
  int64_t pooled_block = 8;
  int64_t topk = 4;
  bool oracle = true;
  bool dense = true;   // dense rows for (0, 0) and (layers-1, heads-1)
  bool gates = true;   // a static gate "synthetic_gate" and a time-varying one
  bool series = true;  // a series "cutoff" with NaN holes (synthetic_series)
  uint64_t seed = 1;
  // A retrieval task's marks: prompt tokens [needle_begin, needle_begin +
  // needle_tokens) get role Needle, the last question_tokens prompt tokens
  // role Question (none by default).
  int64_t needle_begin = -1, needle_tokens = 0, question_tokens = 0;
  // /run layer_window (empty: every layer global).
  std::vector<int64_t> layer_windows;
};

// Cache window of head (l, k): differs per head so views have structure.
int64_t synthetic_window(const SyntheticSpec& spec, int64_t layer, int64_t kv_head);
// Ground truth of the synthetic policy.
int32_t synthetic_admit_step(const SyntheticSpec& spec, int64_t token);
int32_t synthetic_evict_step(const SyntheticSpec& spec, int64_t layer, int64_t kv_head,
                             int64_t token);
// Static gate value of a token at a head (deterministic in seed).
float synthetic_gate(const SyntheticSpec& spec, int64_t layer, int64_t kv_head, int64_t token);
// Value of the series "cutoff" at a step and head: NaN (nothing recorded) where
// step + layer + kv_head is a multiple of 3, so every trace has holes.
float synthetic_series(const SyntheticSpec& spec, int64_t step, int64_t layer, int64_t kv_head);
// The stalls of step s (empty unless tier 1 is not attended): on a decode
// step, head (l, k) with (s + 3 l + k) % 5 == 0 fetches one of its tier-1
// tokens, waiting 0.5-1.5 ms; needed is 0 or 1 with the oracle, else -1.
std::vector<StallRow> synthetic_stalls(const SyntheticSpec& spec, int64_t step);
// Step that feeds token t.
int32_t synthetic_step_of_token(const SyntheticSpec& spec, int64_t token);

// The synthetic capture step by step: what write_synthetic_trace hands the
// writer, so tests can compare what they read with what was written.
class SyntheticCapture {
 public:
  explicit SyntheticCapture(const SyntheticSpec& spec);
  const RunInfo& run() const { return run_; }
  const CaptureLayout& layout() const { return layout_; }
  int64_t n_steps() const;
  StepData step(int64_t s) const;

 private:
  SyntheticSpec spec_;
  RunInfo run_;
  CaptureLayout layout_;
  std::vector<std::string> texts_;
};

// Writes the trace; returns the number of steps. `stop_after_steps` >= 0
// returns without close() after that many steps (an unfinished trace).
int64_t write_synthetic_trace(const std::string& path, const SyntheticSpec& spec,
                              TraceWriter::Options options = {}, int64_t stop_after_steps = -1);

}  // namespace kvscope::trace
