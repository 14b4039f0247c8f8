// The Deferred Retention Rate (seed 004, "Metrics"): the fraction of
// deferred-salience tokens available in attended memory, or promoted in time,
// when they are needed.
//
// Deferred-salience tokens are the trace's Needle tokens (before the final
// question). The needed steps are the steps that feed the final question's
// tokens (the last run of Question tokens) and every step after it (the
// answer). For each (needle token, layer, kv head, needed step s) the token
// is available when step s's attention could read it:
//   - the token was fed by step s itself (a step always attends its own keys), or
//   - at the end of step s - 1 it sat in a tier whose /run tier_attended flag
//     is 1 (single-tier policies: it was held), or
//   - a Promote event at step s moved it into an attended tier (policies
//     promote before attention, and evict or demote after it).
// Read-time selection (Select events, Quest) is not considered: a held entry
// counts as available, as the seed's "available in HBM" does.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/trace/reader.h"

namespace kvscope::analysis {

struct DeferredRetention {
  int64_t needle_tokens = 0;       // deferred-salience tokens
  int64_t question_begin = -1;     // first token of the final question
  int64_t first_needed_step = -1;  // the step feeding question_begin
  int64_t needed_steps = 0;        // first_needed_step .. the last step
  int64_t checks = 0;              // (needle token, layer, kv head, needed step) combinations
  int64_t available = 0;           // of which the token was available
  int64_t promoted = 0;            // of which it was available only through a promotion at the step
  double rate = 0;                 // available / checks: the DRR
  std::vector<double> layer_rate;  // the DRR of each layer
  int64_t pairs = 0;               // (needle token, layer, kv head)
  int64_t pairs_always = 0;        // of which available at every needed step
  double always_share = 0;         // pairs_always / pairs
};

// Empty when the trace holds no Needle token before a final Question run, or
// no step feeds the question yet.
std::optional<DeferredRetention> deferred_retention(const trace::TraceReader& reader);

}  // namespace kvscope::analysis
