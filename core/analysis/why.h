// Why did a retrieval fail? (`kvscope why TRACE`.) Reads a captured task
// trace and says what the policy did to the needle — the trace's Needle
// tokens — in words and numbers:
//   - the needle's fate in every (layer, kv head): each needle token evicted,
//     demoted to a tier the attention does not read, or refused admission,
//     at which step, with the event's reason and score, and the policy's
//     cutoff when it records one (a series whose name contains "cutoff");
//   - what the answer's queries could still read: the cache after the last
//     prefill step (the answer step; its own queries saw the whole chunk),
//     and, for read-time selection, what the first answer query selected;
//   - attention at the answer: at the first decode step (the first answer
//     token's query), the policy's received mass on the needle
//     (/attention/received) and the full cache's attention on keys the
//     policy no longer held (/oracle lost_mass);
//   - the first step where the policy's next-token distribution diverges
//     from the full cache's: KL(full || policy) above a threshold (/oracle);
//   - a one-line verdict.
// Parts whose capture level is missing are reported as absent, not guessed.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/trace/reader.h"

namespace kvscope::analysis {

inline constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

// One needle token leaving the readable cache of one head.
struct NeedleLoss {
  int32_t step = 0;
  int32_t layer = 0;
  int32_t kv_head = 0;
  int32_t token = 0;
  std::string kind;    // "evict", "demote" (to an unread tier) or "reject"
  std::string reason;  // the event's reason name
  double score = kNoValue;
  double cutoff = kNoValue;  // the policy's cutoff series at (step, layer, kv head)
};

struct NeedleToken {
  int32_t token = 0;
  int32_t position = 0;
  std::string text;
  int32_t heads_lost = 0;        // heads where it left the readable cache by the answer
  int32_t heads_readable = 0;    // heads that could read it after the prompt
  int32_t first_loss_step = -1;  // -1: never lost
};

struct WhyReport {
  std::string trace;
  std::string policy;       // the spec as given
  std::string policy_name;  // its registry name
  std::string task;
  std::string expected_answer;
  std::string generated;
  int8_t success = -1;  // 1 found, 0 missed, -1 no task / unfinished
  double score = std::numeric_limits<double>::quiet_NaN();  // share of the answers found
  int64_t n_heads = 0;                                      // layers x kv heads
  int64_t answer_step = -1;
  std::vector<NeedleToken> needle;
  std::vector<NeedleLoss> losses;  // by the answer step, in event order
  std::string cutoff_series;       // the series read for cutoffs ("" none)
  int64_t heads_whole_needle = 0;  // heads that could read every needle token after the prompt
  int64_t heads_no_needle = 0;     // heads that could read none of it
  // Read-time selection (Select events, e.g. Quest) at the first decode step:
  // in the heads that selected, of the (needle token, head) pairs the cache
  // held, how many the query read.
  bool selects = false;  // some head selected at that step
  int64_t selective_heads = 0;
  int64_t needle_held_pairs = 0;
  int64_t needle_selected_pairs = 0;
  double policy_needle_mass = kNoValue;  // mean over kv heads, first decode step
  double oracle_lost_mass = kNoValue;    // mean over query heads, first decode step
  double max_kl = kNoValue;              // largest KL(full || policy) from the answer step on
  int64_t max_kl_step = -1;
  double kl_threshold = 0;
  int64_t divergence_step = -1;  // first step >= answer_step with KL above the threshold
  double divergence_kl = kNoValue;
  std::string divergence_token;  // the token generated from that step's logits
  std::string verdict;
};

// Throws InputError (naming the trace) when it holds no Needle tokens.
WhyReport explain_retrieval(const trace::TraceReader& reader, double kl_threshold);
// What a trace without needle tokens (a dataset row) can say: the task's
// outcome and the oracle's divergence from the answer step on; `needle` stays
// empty. A trace with a needle gets explain_retrieval's whole report.
WhyReport explain_outcome(const trace::TraceReader& reader, double kl_threshold);

std::string format_why(const WhyReport& report);

// How event `e` takes its entry out of what the attention reads: "evict",
// "reject", "demote" (to a tier the attention does not read), or null when
// it does not. One definition for why, the replays' checks and the causal
// search's ranking.
const char* readable_loss(const trace::TraceReader& reader, const trace::Event& e);

// "75 % of the answers found" for a multi-answer task found in part (success
// 0, score > 0: RULER's share of the answers); empty otherwise. One wording
// for why, info, the trace info panel and the sweep view.
std::string partial_answers(int8_t success, double score);

// The received attention mass on `tokens` (ascending trace token indices) at
// `step`'s queries, mean over every (layer, kv head); kNoValue where the trace
// has no /attention/received or the step is out of range.
double received_mass_on(const trace::TraceReader& reader, const std::vector<int32_t>& tokens,
                        int64_t step);

}  // namespace kvscope::analysis
