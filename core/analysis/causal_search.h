// The causal search of `kvscope why --causal`: which (layer, kv head)
// losses cost the answer. The search is given an evaluation — a replay of
// the capture with the policy's losses restored in a set of heads (and,
// for single effects, the needle dropped from one head of the full cache)
// — and finds, within a replay budget, the smallest set of heads whose
// restoration recovers the answer: ordered by the observational ranking
// (what each head lost of the needle, `kvscope why`), the smallest
// recovering prefix of layers by bisection, then delta debugging (drop runs
// of them, halving the run down to one, weakest first) over layers, then the
// same over the heads of the layers kept. Each layer's and each selected head's single effect
// follows while the budget lasts. The search knows nothing of models: tests give it planted
// evaluations.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace kvscope::analysis {

// What one replay measured.
struct ReplayEffect {
  double logprob = std::numeric_limits<double>::quiet_NaN();  // the answer's, teacher-forced
  int64_t rank = -1;                                          // of its first token
  int8_t success = -1;
  double score = std::numeric_limits<double>::quiet_NaN();
};

// One replay the search asks for: restore the policy's losses in `restore`
// ([L * K] flags), and drop the needle in `drop` ([L * K], empty: none).
struct ReplayRequest {
  std::vector<uint8_t> restore;
  std::vector<uint8_t> drop;
  std::string label;  // what it is for: "all", "layers 3-5", "layer 4 alone", ...
};

struct ReplayRecord {
  ReplayRequest request;
  ReplayEffect effect;
  bool recovered = false;
};

using ReplayEvaluator = std::function<ReplayEffect(const ReplayRequest&)>;

struct CausalQuery {
  int64_t layers = 0, kv_heads = 0;
  // [L * K]: the observational ranking (needle tokens lost, else entries
  // lost), and where the policy lost anything at all (only those can matter).
  std::vector<double> head_score;
  std::vector<uint8_t> lost;
  ReplayEffect original;
  int64_t budget = 48;    // replays at most (>= 1)
  double fraction = 0.9;  // of the log-probability gap to the full restoration that recovers
  // Whether the trace marks a needle to drop from the full restoration
  // (the single effects' drops; none without one).
  bool has_needle = true;
  // A gap below this (nats) is no gap: recovery is then judged by success or score.
  double min_gap = 0.1;
};

struct HeadEffect {
  int64_t layer = 0, kv_head = -1;  // kv_head -1: the whole layer
  ReplayEffect restore;             // restoring only it
  ReplayEffect drop;                // the full restoration with the needle dropped there
  bool has_restore = false, has_drop = false;
  int64_t restore_replay = -1, drop_replay = -1;  // indices into CausalResult::replays
};

struct CausalResult {
  ReplayEffect original, full;  // the policy's run, and every loss restored
  bool recoverable = false;     // the full restoration recovers the answer
  double threshold = std::numeric_limits<double>::quiet_NaN();  // log p that counts as recovered
  std::vector<uint8_t> minimal;  // [L * K]: the set found (empty: none)
  ReplayEffect minimal_effect;
  int64_t minimal_replay = -1;     // index into replays
  bool minimal_confirmed = false;  // every removal was tried within the budget
  std::vector<HeadEffect> layer_effects, head_effects;
  std::vector<ReplayRecord> replays;  // every replay, in order
  int64_t budget = 0;
  bool budget_exhausted = false;
};

// Throws std::invalid_argument for a query whose sizes disagree or a budget below 1.
CausalResult causal_search(const CausalQuery& query, const ReplayEvaluator& evaluate);

// "restoring the needle's losses in layer 12 kv head 0 and layer 14 kv head
// 2 recovers the answer: log p -9.1 -> -0.4; no single head does" and the rest, in words.
std::string format_causal(const CausalResult& result, int64_t kv_heads);

// The heads of a [L * K] set as "L.H" items.
std::vector<std::string> head_names(const std::vector<uint8_t>& set, int64_t kv_heads);
// One such item back into (layer, kv head); false (both -1) when it is none.
bool parse_head_name(const std::string& name, int64_t* layer, int64_t* kv_head);

}  // namespace kvscope::analysis
