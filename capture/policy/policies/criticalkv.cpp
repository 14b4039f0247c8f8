// criticalkv: CriticalKV (Feng et al., "Identify Critical KV Cache in LLM
// Inference from an Output Perturbation Perspective", 2025), as kvpress's
// CriticalKVPress computes it around any scorer. Attention weight alone
// ignores how much an entry can move the layer's output; the output
// perturbation of dropping entry j is bounded by its weight times
// ||W_o v_j||_1. Two stages per head:
//   1. the top floor(budget x first_stage) entries by the base score stay
//      (the base scorer's protected entries count first);
//   2. the rest of the budget goes to the highest (s_j + epsilon) ||W_o^r v_j||_1,
//      mean over the group's query heads r (W_o^r: the output projection's
//      columns of head r).
// A base scorer that keeps log scores (expected_attention) is exponentiated
// first (kvpress rescales probabilities; it also suggests vnorm=false there).
// docs/policies/criticalkv.md
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/output_projection.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class CriticalScorer : public HeadScorer {
 public:
  CriticalScorer(std::unique_ptr<HeadScorer> base, int64_t budget, double first_stage,
                 double epsilon)
      : base_(std::move(base)), budget_(budget), first_stage_(first_stage), epsilon_(epsilon) {}

  void setup(const PolicySetup& s) override {
    base_->setup(s);
    H_ = s.model->n_heads, K_ = s.model->n_kv_heads, hd_ = s.model->head_dim;
    norms_.setup(per_head_output_projections(s.weights, H_, hd_, "criticalkv"), K_, s.max_tokens);
    base_scores_.resize(s.model->n_layers, K_, s.max_tokens);
  }
  cache::StatsNeeds stats_needs() const override { return base_->stats_needs(); }
  std::string score_name() const override { return "criticalkv"; }
  std::string score_meaning() const override {
    return "(base score + epsilon) x ||W_o v||_1 (mean over the group), the base score's top "
           "first_stage x budget entries max";
  }
  bool compresses(const LayerContext& c) const override { return base_->compresses(c); }
  void observe(LayerContext& c) override { base_->observe(c); }
  Protection protection() const override { return base_->protection(); }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    float* base = base_scores_.at(c.layer, kv_head);
    base_->score(c, kv_head, base);
    const std::vector<int32_t>& held = c.cache.positions(c.layer, kv_head, 0);
    const int64_t m = int64_t(held.size());
    if (m == 0) return;
    norm_.resize(size_t(m));
    norms_.of(c.cache, c.layer, kv_head, held, norm_.data());
    // Stage 1 ranks by the base score, the base's protected entries first
    // (kvpress's scorers give them the top score, so they take stage-1 slots).
    const Protection keep = base_->protection();
    std::vector<std::pair<float, int32_t>> first;  // (base score, pos)
    for (int64_t j = 0; j < m; ++j) {
      const int32_t pos = held[size_t(j)];
      const float s = base_->log_scores() ? std::exp(base[pos]) : base[pos];
      const bool pinned = keep.protects(pos, c.tokens_fed());
      first.push_back({pinned ? std::numeric_limits<float>::infinity() : s, pos});
      out[pos] = (s + float(epsilon_)) * norm_[size_t(j)];
    }
    int64_t stage1 = int64_t(double(budget_) * first_stage_);
    if (first_stage_ > 0) stage1 = std::max<int64_t>(1, stage1);
    stage1 = std::min<int64_t>(stage1, m);
    // Highest base scores first; ties keep the newer (the common tie rule).
    std::partial_sort(first.begin(), first.begin() + stage1, first.end(),
                      [](const auto& a, const auto& b) {
                        return a.first != b.first ? a.first > b.first : a.second > b.second;
                      });
    for (int64_t i = 0; i < stage1; ++i)
      out[first[size_t(i)].second] = std::numeric_limits<float>::max();
  }

 private:
  std::unique_ptr<HeadScorer> base_;
  int64_t budget_;
  double first_stage_, epsilon_;
  int64_t H_ = 0, K_ = 0, hd_ = 0;
  OutputNorms norms_;
  std::vector<float> norm_;  // scratch: the held entries' norms
  HeadScores base_scores_;
};

}  // namespace

PolicyDescriptor criticalkv_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "snapkv", "base scorer: " + scorer_names()},
      {"budget", ParamType::Int, "256", "entries kept per head"},
      {"first_stage", ParamType::Float, "0.5", "share of the budget kept by the base score alone",
       0, 1},
      {"critical_epsilon", ParamType::Float, "1e-4",
       "added to the base score before the rescaling (kvpress: epsilon)", 0, 1e6},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  params = with_scorer_params(std::move(params));
  return {"criticalkv",
          "CriticalKV: a scorer's top entries, then the rest by score x ||W_o v||_1 (output "
          "perturbation)",
          "Feng et al., Identify Critical KV Cache in LLM Inference from an Output Perturbation "
          "Perspective, 2025 (kvpress CriticalKVPress)",
          "docs/policies/criticalkv.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "criticalkv:budget", "must be >= 1");
            auto base = make_named_scorer("criticalkv", p);
            auto policy = std::make_unique<ScoredPolicy>(
                std::make_unique<CriticalScorer>(std::move(base), p.get_int("budget"),
                                                 p.get_float("first_stage"),
                                                 p.get_float("critical_epsilon")),
                std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
                "lowest critical score");
            policy->set_scorer_name("criticalkv(" + p.get_string("scorer") + ")");
            return policy;
          }};
}

}  // namespace kvscope::policy
