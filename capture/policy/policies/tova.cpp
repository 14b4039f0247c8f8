// tova: Token Omission Via Attention (Oren et al., "Transformers are
// Multi-State RNNs", EMNLP 2024). After every forward pass, while a layer
// holds more than `budget` tokens, the tokens with the lowest attention weight
// of the current (last) query leave; the weights are averaged over all the
// layer's heads, so every head of a layer keeps the same tokens (the paper's
// best variant and the official tova_cache.py). The current token is a
// candidate like any other. docs/policies/tova.md
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class TovaScorer : public HeadScorer {
 public:
  explicit TovaScorer(bool mean_heads) : mean_heads_(mean_heads) {}
  cache::StatsNeeds stats_needs() const override { return {false, true, 0}; }
  std::string score_name() const override { return "tova_last_query_attention"; }
  std::string score_meaning() const override {
    return mean_heads_ ? "attention weight of the step's last query, mean over the layer's heads"
                       : "attention weight of the step's last query, mean over the group's heads";
  }
  // Every forward pass, prefill chunks included (official: reduce() after
  // each forward).
  bool compresses(const LayerContext&) const override { return true; }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const int64_t K = c.cache.n_kv_heads();
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) {
      if (!mean_heads_) {
        out[pos] = c.stats.last_query[size_t(kv_head)][size_t(pos)];
        continue;
      }
      // last_query is the mean over a group; groups have equal size, so the
      // mean of the group means is the mean over all query heads.
      float s = 0;
      for (int64_t h = 0; h < K; ++h) s += c.stats.last_query[size_t(h)][size_t(pos)];
      out[pos] = s / float(K);
    }
  }

 private:
  bool mean_heads_;
};

std::vector<ParamSpec> tova_params() {
  return {
      {"mean_heads", ParamType::Bool, "true",
       "average the last query's weights over all heads of the layer (paper); false: per kv head"}};
}

std::unique_ptr<HeadScorer> make_tova(const Params& p) {
  return std::make_unique<TovaScorer>(p.get_bool("mean_heads"));
}

}  // namespace

ScorerDescriptor tova_scorer() {
  return {"tova", tova_params(), make_tova};
}

PolicyDescriptor tova_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "tokens kept per head (the multi-state size)"}};
  for (const ParamSpec& s : tova_params()) params.push_back(s);
  return {"tova",
          "drop the tokens the current query attends to least (layer-averaged), at every step",
          "Oren et al., Transformers are Multi-State RNNs, EMNLP 2024",
          "docs/policies/tova.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "tova:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_tova(p),
                                                  std::vector<int64_t>{p.get_int("budget")}, true,
                                                  "lowest current-query attention");
          }};
}

}  // namespace kvscope::policy
