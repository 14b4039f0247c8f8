#include "capture/policy/scorer.h"

#include <algorithm>
#include <limits>

namespace kvscope::policy {

const ScorerDescriptor* find_scorer(const std::string& name) {
  for (const ScorerDescriptor& d : builtin_scorers())
    if (d.name == name) return &d;
  return nullptr;
}

ScoredPolicy::ScoredPolicy(std::unique_ptr<HeadScorer> scorer, std::vector<int64_t> layer_budgets,
                           bool decode, std::string reason)
    : scorer_(std::move(scorer)),
      budgets_(std::move(layer_budgets)),
      decode_(decode),
      reason_(std::move(reason)) {}

void ScoredPolicy::setup(const PolicySetup& s) {
  Policy::setup(s);
  scorer_->setup(s);
  scores_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens,
                 std::numeric_limits<float>::quiet_NaN());
}

std::vector<trace::GateSpec> ScoredPolicy::gates() const {
  return {{scorer_->score_name(), scorer_->score_meaning(), "score",
           std::numeric_limits<double>::quiet_NaN(), true}};
}

int64_t ScoredPolicy::layer_budget(int64_t layer) const {
  return budgets_.size() == 1 ? budgets_[0] : budgets_[size_t(layer)];
}

int64_t ScoredPolicy::budget() const {
  return budgets_.empty() ? 0 : *std::max_element(budgets_.begin(), budgets_.end());
}

void ScoredPolicy::score_head(LayerContext& c, int64_t kv_head, float* score_by_pos) {
  scorer_->score(c, kv_head, score_by_pos);
  // The latest score of every held entry; a time series every 16 steps.
  for (int32_t pos : c.cache.positions(c.layer, kv_head, 0))
    c.decide.gate(0, c.layer, kv_head, pos, score_by_pos[pos], c.step % 16 == 0);
}

void ScoredPolicy::after_attention(LayerContext& c) {
  scorer_->observe(c);
  if (!compressing(c)) return;
  const int64_t keep = layer_budget(c.layer);
  const Protection protect = scorer_->protection();
  for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
    if (c.cache.count(c.layer, h, 0) <= keep) continue;
    float* s = scores_.at(c.layer, h);
    score_head(c, h, s);
    evict_to_budget(c.decide, c.layer, h, keep, protect, s, 1);
  }
}

}  // namespace kvscope::policy
