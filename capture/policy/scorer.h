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
};

// A scorer by name, for wrappers (`adakv:scorer=NAME,...`).
struct ScorerDescriptor {
  std::string name;
  std::vector<ParamSpec> params;  // the scorer's own parameters (no budget)
  std::function<std::unique_ptr<HeadScorer>(const Params&)> make;
};

// The scorers a wrapper may use (defined in policies/adakv.cpp).
const std::vector<ScorerDescriptor>& builtin_scorers();
const ScorerDescriptor* find_scorer(const std::string& name);

// Keeps, per (layer, kv head), the `layer_budgets[layer]` highest-scored
// entries (the scorer's protected entries count towards it) whenever the
// scorer compresses; `decode` false stops compressing after the prefill
// (the prefill-only papers' behaviour: the cache then grows).
class ScoredPolicy : public Policy {
 public:
  ScoredPolicy(std::unique_ptr<HeadScorer> scorer, std::vector<int64_t> layer_budgets, bool decode,
               std::string reason);
  void setup(const PolicySetup& s) override;
  std::vector<std::string> reason_names() const override { return {"new token", reason_}; }
  std::vector<trace::GateSpec> gates() const override;
  cache::StatsNeeds stats_needs() const override { return scorer_->stats_needs(); }
  std::string budget_kind() const override { return decode_ ? "head" : "none"; }
  int64_t budget() const override;
  void after_attention(LayerContext& c) override;

  HeadScorer& scorer() { return *scorer_; }
  int64_t layer_budget(int64_t layer) const;

 protected:
  bool compressing(const LayerContext& c) const {
    return scorer_->compresses(c) && (decode_ || c.prefill);
  }
  // Scores of the held entries; sampled into the trace as a gate.
  void score_head(LayerContext& c, int64_t kv_head, float* score_by_pos);

  std::unique_ptr<HeadScorer> scorer_;
  std::vector<int64_t> budgets_;  // one per layer (a single value: every layer)
  bool decode_;
  std::string reason_;
  HeadScores scores_;
};

}  // namespace kvscope::policy
