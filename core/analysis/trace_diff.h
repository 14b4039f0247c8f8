// Comparing two traces of the same prompt: which tokens each head kept under
// policy A and not under policy B, and the reverse.
#pragma once

#include <cstdint>
#include <vector>

#include "core/analysis/lifetimes.h"
#include "core/trace/reader.h"

namespace kvscope::analysis {

// Throws InputError (naming the file and field) unless both traces have the
// same model shape and feed the same prompt token ids.
void check_comparable(const trace::TraceReader& a, const trace::TraceReader& b);

// The step of `to` that fed the same last token as `step` of `from` (its step
// records, as read once); traces with other prefill chunking still line up by
// position.
int64_t aligned_step(const std::vector<int32_t>& to_fed_step,
                     const std::vector<trace::StepRecord>& from_steps, int64_t step);

enum TokenDiff : uint8_t { kHeldByNeither = 0, kOnlyA = 1, kOnlyB = 2, kHeldByBoth = 3 };

struct HeadDiffCounts {
  int32_t only_a = 0, only_b = 0, both = 0;
};

// Tokens [0, n) that are the same token ids in both traces: the prompt and
// as much of the generation as did not diverge. Only these compare.
int64_t shared_prefix(const trace::TraceReader& a, const trace::TraceReader& b);

// Per (layer, kv head): counts over tokens [0, token_end) (-1: all both have).
std::vector<HeadDiffCounts> diff_heads(const AllLifetimes& a, const AllLifetimes& b, int64_t step_a,
                                       int64_t step_b, int64_t token_end = -1);
// Per token of one head.
std::vector<uint8_t> diff_tokens(const AllLifetimes& a, const AllLifetimes& b, int64_t layer,
                                 int64_t kv_head, int64_t step_a, int64_t step_b,
                                 int64_t token_end = -1);

// A span of tokens (a needle, a selection) followed over the steps of A:
// per (layer, kv head) and step s of A, compared with step step_b[s] of B,
// the share of the span held by A and not B and by B and not A. A token
// outside either trace's lifetimes counts as held by neither.
struct SpanDiff {
  int64_t heads = 0, steps = 0;
  std::vector<float> only_a, only_b;  // [(l * K + k) * steps + s]
  float at(const std::vector<float>& v, int64_t head, int64_t step) const {
    return v[size_t(head * steps + step)];
  }
};
SpanDiff diff_span(const AllLifetimes& a, const AllLifetimes& b, const std::vector<int64_t>& span,
                   const std::vector<int64_t>& step_b);

}  // namespace kvscope::analysis
