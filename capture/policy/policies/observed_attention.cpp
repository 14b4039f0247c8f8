// observed_attention: the attention an entry received, averaged over the
// queries that could see it (kvpress ObservedAttentionPress, "related to
// H2O"). kvpress sums the prefill's attention over all queries and divides by
// the number of queries that could attend key j, T - j (a causal mask hides j
// from the queries before it); under GQA it averages the group's heads:
//   score(j) = (1 / (t - j)) * sum_{i >= j} mean_{heads of the group} A[i, j]
// with t the tokens fed. KVScope keeps the sum across prefill chunks and
// decode steps, so at decode the score stays "mean attention per query that
// saw it" (kvpress: prefill only; decode=false gives that). H2O (h2o.md)
// keeps the raw sum, which favours old tokens. docs/policies/observed_attention.md
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class ObservedAttentionScorer : public HeadScorer {
 public:
  void setup(const PolicySetup& s) override {
    sums_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
  }
  cache::StatsNeeds stats_needs() const override { return {true, false, 0}; }
  std::string score_name() const override { return "observed_attention"; }
  std::string score_meaning() const override {
    return "attention received, summed over queries and divided by the queries that could see "
           "the entry (mean over the group's heads)";
  }
  void observe(LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* sum = sums_.at(c.layer, h);
      const std::vector<float>& received = c.stats.received[size_t(h)];
      // received is the mean over the step's n queries.
      for (int32_t pos : c.cache.positions(c.layer, h, 0))
        sum[pos] += received[size_t(pos)] * float(c.n);
    }
  }
  Subsets subsets() const override { return Subsets::Entry; }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* sum = sums_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0))
      out[pos] = sum[pos] / float(c.tokens_fed() - pos);
  }

 private:
  HeadScores sums_;
};

std::unique_ptr<HeadScorer> make_observed(const Params&) {
  return std::make_unique<ObservedAttentionScorer>();
}

}  // namespace

ScorerDescriptor observed_attention_scorer() {
  return {"observed_attention", {}, make_observed};
}

PolicyDescriptor observed_attention_descriptor() {
  return {"observed_attention",
          "mean attention an entry received from the queries that could see it (kvpress's H2O "
          "variant)",
          "kvpress ObservedAttentionPress; Zhang et al., H2O, NeurIPS 2023",
          "docs/policies/observed_attention.md",
          {{"budget", ParamType::Int, "256", "entries kept per head"},
           {"decode", ParamType::Bool, "true",
            "also compress at every decode step (false: prefill only, as kvpress)"}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "observed_attention:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(
                make_observed(p), std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
                "lowest observed attention");
          }};
}

}  // namespace kvscope::policy
