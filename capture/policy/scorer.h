// Per-head scorers: the kvpress idea of "one small class with a score" on the
// policy framework. A HeadScorer rates every entry a (layer, kv head) holds
// (higher = more worth keeping); ScoredPolicy turns a scorer into a policy
// that keeps each head's `budget(layer)` best entries whenever the scorer says
// to compress, and AdaKV (policies/adakv.cpp) turns the same scorer into a
// per-layer budget shared across the layer's heads. docs/policies/adakv.md
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "capture/policy/budget.h"
#include "capture/policy/held_rows.h"
#include "capture/policy/merge_values.h"
#include "capture/policy/params.h"
#include "capture/policy/policy.h"

namespace kvscope::policy {

class HeadScorer {
 public:
  virtual ~HeadScorer() = default;
  virtual void setup(const PolicySetup& setup) {}
  virtual cache::StatsNeeds stats_needs() const { return {}; }
  // The score as a trace gate: name ([A-Za-z0-9_-]+) and meaning.
  virtual std::string score_name() const = 0;
  virtual std::string score_meaning() const = 0;
  // Whether the layer compresses after this step's attention. The default is
  // the prefill-time methods' rule: once the whole prompt is in the cache, and
  // then at every decode step.
  virtual bool compresses(const LayerContext& c) const { return c.prompt_complete; }
  // Called after every layer's attention, compressing or not (state updates:
  // accumulations, observation windows, per-key constants).
  virtual void observe(LayerContext& c) {}
  // Entries that never leave (the scorer's own sinks and recent window).
  virtual Protection protection() const { return {}; }
  // Writes score_by_pos[pos] for every position head (c.layer, kv_head) holds
  // in tier 0; other positions are left as they are.
  virtual void score(LayerContext& c, int64_t kv_head, float* score_by_pos) = 0;
  // Whether score() writes the natural log of the score (expected attention:
  // its scores underflow float32); wrappers that rescale exponentiate it.
  virtual bool log_scores() const { return false; }
  // How the score of an entry depends on the other entries, for the block
  // wrapper (kvpress BlockPress), which scores subsets of the held entries:
  // Entry: each entry's score is its own (knorm), so a subset's scores are
  // the held ones'; Set: the score depends on the set but not its order
  // (keydiff's anchor), and score_rows() scores a given set; Other: neither
  // (order-dependent, or needs queries of the whole prompt) - no blocks.
  enum class Subsets { Entry, Set, Other };
  virtual Subsets subsets() const { return Subsets::Other; }
  // Subsets::Set: writes out[pos] for the entries `rows` (a subset of what
  // head (c.layer, kv_head) holds, position order) as if they were all it held.
  virtual void score_rows(LayerContext& c, int64_t kv_head, const struct HeldRows& rows,
                          float* out) {}
  // Parameters the scorer resolved at setup (for /run policy_params).
  virtual std::vector<std::pair<std::string, double>> resolved_params() const { return {}; }
};

// A scorer by name, for wrappers (`adakv:scorer=NAME,...`).
struct ScorerDescriptor {
  std::string name;
  std::vector<ParamSpec> params;  // the scorer's own parameters (no budget)
  std::function<std::unique_ptr<HeadScorer>(const Params&)> make;
};

// The scorers a wrapper may use (builtin.cpp).
const std::vector<ScorerDescriptor>& builtin_scorers();
const ScorerDescriptor* find_scorer(const std::string& name);
// Every scorer parameter, once, as a string parameter of a policy built
// around a scorer (adakv, criticalkv), which passes it on.
std::vector<ParamSpec> scorer_forwarded_params();
// A wrapper's own parameters followed by the forwarded ones; a name in both
// is a programming error (std::logic_error): one would shadow the other.
std::vector<ParamSpec> with_scorer_params(std::vector<ParamSpec> own);
// "snapkv, tova, ..." for help texts and messages.
std::string scorer_names();
// The scorer named by p's `scorer` with the forwarded parameters it takes;
// InputError naming `policy:scorer` or `policy:PARAM` otherwise.
std::unique_ptr<HeadScorer> make_named_scorer(const std::string& policy, const Params& p);

// How an eviction part turns a scorer's scores into evictions: the allocator
// of budgets over layers and heads, the cadence and extra protections. The
// wrappers (`+pyramid`, `+adakv`, `+chunk`, `+layer_ratios`, `+cadence`,
// `+protect`; capture/policy/wrappers.cpp) each set one field.
struct EvictionShape {
  bool adaptive = false;       // AdaKV: one budget per layer shared across its heads
  double alpha = 0.2;          // AdaKV's safeguard: each head keeps its top floor(alpha x budget)
  double pyramid_beta = 0;     // > 0: PyramidKV's layer budgets (mean = budget)
  bool pyramid_whole = false;  // kvpress PyramidKVPress: the whole budget on the sequence
  std::vector<double> layer_keep;  // layer_ratios: fraction of the prompt each layer keeps per head
  int64_t chunk = 1;          // ChunkKV: entries scored and kept by chunks of consecutive positions
  bool chunk_shared = false;  // kvpress ChunkKV: one chunk choice for all the layer's heads
  int64_t chunk_entropy = 0;  // > 0: kvpress EntropyGatedChunkKV, spiky chunks keep this many
  int64_t block = 0;      // kvpress BlockPress: the prompt compressed block by block (0: at once)
  int64_t per_chunk = 0;  // kvpress ChunkPress: each chunk of the prompt keeps its share alone
  bool merge = false;     // kvpress MergingPress: leaving values fold into similar survivors
  bool rerotate = false;  // kvpress KeyRerotationPress: kept keys re-rotated to positions 0..n-1
  MergeOptions merge_options;
  int64_t every = 1;    // decode steps between compressions
  bool prefill = true;  // compress at the end of the prefill (false: kvpress DecodingPress)
  double grow = 0;      // > 0: at decode the budget is this share of the tokens fed
                        // (kvpress CompressionRatioDecodingPress)
  Protection extra;     // protections on top of the scorer's own
};

// The eviction part: a scorer + an allocator + a cadence + protections.
// Keeps, per (layer, kv head), the `layer_budget(layer)` highest-scored
// entries (uniform), or per layer the budget x kv heads best entries wherever
// they are (adaptive), whenever the scorer compresses; `decode` false stops
// compressing after the prefill (the prefill-only papers' behaviour: the cache
// then grows).
class ScoredPolicy : public Policy {
 public:
  ScoredPolicy(std::unique_ptr<HeadScorer> scorer, std::vector<int64_t> layer_budgets, bool decode,
               std::string reason);
  void setup(const PolicySetup& s) override;
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override { return {"new token", reason_}; }
  std::vector<trace::GateSpec> gates() const override;
  cache::StatsNeeds stats_needs() const override { return scorer_->stats_needs(); }
  std::string budget_kind() const override;
  int64_t budget() const override;
  HeldLimit held_limit(const LayerContext& c) const override;
  void after_attention(LayerContext& c) override;

  HeadScorer& scorer() { return *scorer_; }
  const std::string& scorer_name() const { return scorer_name_; }
  void set_scorer_name(std::string name) { scorer_name_ = std::move(name); }
  int64_t base_budget() const { return budgets_.empty() ? 0 : budgets_[0]; }
  int64_t layer_budget(int64_t layer) const;
  // The budget this step: layer_budget, or at decode with a growing budget
  // max(1, floor(grow x tokens fed)).
  int64_t budget_at(const LayerContext& c) const;
  EvictionShape& shape() { return shape_; }
  const EvictionShape& shape() const { return shape_; }
  std::string describe() const override;
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return scorer_->resolved_params();
  }

 protected:
  bool compressing(const LayerContext& c) const;
  Protection protection() const;
  // Scores of the held entries (chunk-summed when chunked); sampled into the
  // trace as a gate.
  void score_head(LayerContext& c, int64_t kv_head, float* score_by_pos);
  void evict(LayerContext& c);
  void evict_uniform(LayerContext& c);
  void evict_adaptive(LayerContext& c);
  void evict_shared_chunks(LayerContext& c);
  void evict_entropy_chunks(LayerContext& c, int64_t keep);
  void rerotate_held(LayerContext& c);
  void evict_blocks(LayerContext& c);
  void evict_per_chunk(LayerContext& c);

  std::unique_ptr<HeadScorer> scorer_;
  std::string scorer_name_;
  std::vector<int64_t> budgets_;  // one per layer (a single value: every layer)
  bool decode_;
  std::string reason_;
  EvictionShape shape_;
  HeadScores scores_;
  // rerotate: the RoPE position each entry's cached key carries, [L][K][M].
  std::vector<int32_t> rope_pos_;
  std::unique_ptr<RopeInverse> turn_back_;
};

}  // namespace kvscope::policy
