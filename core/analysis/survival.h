// Survival curves (seed 002, fig. 2): for a head, the fraction of tokens
// still held by the policy, and still receiving attention, at horizon h —
// h token positions after the token was fed.
//
// held(h):     token t is held by the head during the step that feeds
//              position t + h (tokens never admitted count as not held).
// attended(h): some query at position >= t + h attends t: it is in that
//              query's top-k (when /attention/topk was captured, over the
//              query heads of the kv head's group), or else among the keys
//              making up `mass_share` of a step's received mass
//              (/attention/received).
// Both are over the tokens observable at h (t + h < tokens in the trace), so
// late tokens do not pull the curves down (right censoring).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/analysis/lifetimes.h"
#include "core/trace/reader.h"

namespace kvscope::analysis {

struct SurvivalCurve {
  std::vector<double> held;      // [h], h = 0..max_h
  std::vector<double> attended;  // [h]; empty when no attention was captured
  std::vector<int64_t> at_risk;  // tokens observable at h
};

// Last query position attending each token, per (layer, kv head): L*K*T,
// -1 where never attended. Empty when the trace has neither topk nor received.
struct LastAttended {
  std::string criterion;  // "top-k", "mass 0.9" or "" when none
  int64_t layers = 0, kv_heads = 0, tokens = 0;
  std::vector<int32_t> position;

  // All heads, or only (layer, kv_head) when given (received rows are read
  // per step and head, so one head is much cheaper).
  static LastAttended read(const trace::TraceReader& reader, double mass_share = 0.9,
                           int layer = -1, int kv_head = -1);
  const int32_t* head(int64_t layer, int64_t kv_head) const {
    return position.empty() ? nullptr : position.data() + (layer * kv_heads + kv_head) * tokens;
  }
};

// `fed_step[t]` is the step that fed token t (HeadTimeline::fed_step).
SurvivalCurve survival(const trace::HeadLifetimes& lifetimes, const std::vector<int32_t>& fed_step,
                       const int32_t* last_attended, int64_t max_h);

// Survival of every (layer, kv head) at one horizon: L*K values (held).
std::vector<double> survival_at(const AllLifetimes& all, const std::vector<int32_t>& fed_step,
                                int64_t h);

}  // namespace kvscope::analysis
