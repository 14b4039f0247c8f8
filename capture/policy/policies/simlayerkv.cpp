// simlayerkv: SimLayerKV (Zhang et al., "SimLayerKV: A Simple Framework for
// Layer-Level KV Cache Reduction", 2024), as kvpress's SimLayerKVPress
// computes it. Some layers attend almost only to the first tokens and the
// most recent ones ("lazy" layers); those keep just that, the others keep
// everything. When the prompt is in, with A the attention of the prompt's last
// `last` queries, mean over those queries and all the layer's heads,
//   lazy = sum_{j < initial} A[j] + sum_{T-last-recent <= j < T-last} A[j] > threshold
// (kvpress scores the keys before the `last` queries' own tokens),
// and a lazy layer keeps its first `initial` and last `recent - last` entries
// (kvpress keeps keys[-recent + last:], one fewer than `recent` at last = 1).
// A prompt no longer than initial + recent + last is not compressed, nor is
// anything at threshold 1 (kvpress's "off"). Decode: a lazy layer stays lazy
// and keeps sinks + that window as tokens arrive; the others keep all (the
// paper's decode-time rule re-checks laziness per step; KVScope decides once
// and records the score as the series simlayerkv_lazy_score).
// docs/policies/simlayerkv.md
#include <algorithm>

#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct SimLayerOptions {
  double threshold = 1.0;
  int64_t last = 1, recent = 1024, initial = 4;
};

class SimLayerKvPolicy : public Policy {
 public:
  explicit SimLayerKvPolicy(SimLayerOptions o) : o_(o) {}
  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    lazy_.assign(size_t(s.model->n_layers), -1);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "lazy layer: outside the initial and recent tokens"};
  }
  cache::StatsNeeds stats_needs() const override { return {false, false, o_.last}; }
  std::vector<trace::SeriesSpec> series() const override {
    return {{"simlayerkv_lazy_score",
             "attention of the prompt's last queries on the initial and recent tokens (mean over "
             "the layer's heads); the layer is lazy above the threshold",
             "probability mass"}};
  }
  std::string budget_kind() const override { return "none"; }

  void after_attention(LayerContext& c) override {
    int& lazy = lazy_[size_t(c.layer)];
    if (lazy < 0 && c.prompt_complete) lazy = decide(c) ? 1 : 0;
    if (lazy != 1) return;
    const Protection keep{o_.initial, o_.recent - o_.last};
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      std::vector<int64_t> out = evictable(c.decide, c.layer, h, keep);
      std::sort(out.begin(), out.end());
      evict_all(c.decide, c.layer, h, out, nullptr, 1);
    }
  }

 private:
  bool decide(LayerContext& c) {
    const int64_t T = c.tokens_fed(), K = c.cache.n_kv_heads();
    if (o_.threshold >= 1.0 || T <= o_.initial + o_.recent + o_.last) return false;
    // The observation window holds the last `last` prompt queries' weights,
    // summed over the queries and averaged over each group's heads. T is
    // larger than initial + recent + last, so the two ranges are apart.
    double score = 0;
    for (int64_t h = 0; h < K; ++h) {
      const std::vector<float>& w = c.stats.window[size_t(h)];
      for (int64_t j = 0; j < std::min(o_.initial, T); ++j) score += w[size_t(j)];
      for (int64_t j = T - o_.last - o_.recent; j < T - o_.last; ++j) score += w[size_t(j)];
    }
    score /= double(K) * double(std::max<int64_t>(1, c.stats.window_queries));
    for (int64_t h = 0; h < K; ++h) c.decide.series(0, c.layer, h, float(score));
    return score > o_.threshold;
  }

  SimLayerOptions o_;
  std::vector<int> lazy_;  // per layer: -1 undecided, 0 no, 1 lazy
};

}  // namespace

PolicyDescriptor simlayerkv_descriptor() {
  return {"simlayerkv",
          "lazy layers (attention on the initial and recent tokens above a threshold) keep only "
          "those; other layers keep all",
          "Zhang et al., SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction, 2024 "
          "(kvpress SimLayerKVPress)",
          "docs/policies/simlayerkv.md",
          {{"threshold", ParamType::Float, "0.9",
            "a layer is lazy above this attention mass on initial + recent (1: never)", 0, 1},
           {"last", ParamType::Int, "1", "prompt queries that judge laziness", 1},
           {"recent", ParamType::Int, "1024", "recent tokens a lazy layer keeps (minus `last`)", 1},
           {"initial", ParamType::Int, "4", "initial tokens a lazy layer keeps", 0}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            SimLayerOptions o;
            o.threshold = p.get_float("threshold"), o.last = p.get_int("last");
            o.recent = p.get_int("recent"), o.initial = p.get_int("initial");
            if (o.recent <= o.last)
              throw InputError("--policy", "simlayerkv:recent",
                               "must exceed last (" + std::to_string(o.last) + ")");
            return std::make_unique<SimLayerKvPolicy>(o);
          }};
}

}  // namespace kvscope::policy
