// h2o: Heavy-Hitter Oracle (Zhang et al., "H2O: Heavy-Hitter Oracle for
// Efficient Generative Inference of Large Language Models", NeurIPS 2023).
// Score of a cached key = attention it has received, summed over every query
// since it was written (accumulated attention, Eq. in §3.2 / Alg. 1); keep the
// `heavy` highest-scoring keys plus the `recent` most recent tokens, per head,
// at prefill and at every decode step. GQA: the group's query heads are
// averaged. docs/policies/h2o.md
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class H2oPolicy : public Policy {
 public:
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  H2oPolicy(int64_t heavy, int64_t recent, int64_t sinks) : heavy_(heavy), protect_{sinks, recent} {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    acc_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
  }
  std::vector<std::string> reason_names() const override {
    return {"new token", "lowest accumulated attention"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"accumulated_attention", "attention received, summed over queries (H2O score)",
             "probability mass", std::numeric_limits<double>::quiet_NaN(), true}};
  }
  cache::StatsNeeds stats_needs() const override { return {true, false, 0}; }
  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return heavy_ + protect_.recent + protect_.sinks; }

  void after_attention(LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* acc = acc_.at(c.layer, h);
      const std::vector<float>& received = c.stats.received[size_t(h)];
      // received is the mean over the step's queries: the sum is n times it.
      for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
        acc[pos] += received[size_t(pos)] * float(c.n);
        // The latest score of every held entry; a time series every 16 steps.
        c.decide.gate(0, c.layer, h, pos, acc[pos], c.step % 16 == 0);
      }
      evict_to_budget(c.decide, c.layer, h, budget(), protect_, acc, 1);
    }
  }

  const HeadScores& accumulated() const { return acc_; }

 private:
  int64_t heavy_;
  Protection protect_;
  HeadScores acc_;
};

}  // namespace

PolicyDescriptor h2o_descriptor() {
  return {"h2o",
          "heavy hitters (accumulated attention) + recent window, at prefill and every decode step",
          "Zhang et al., H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs, NeurIPS 2023",
          "docs/policies/h2o.md",
          {{"heavy", ParamType::Int, "128", "heavy hitters kept per head"},
           {"recent", ParamType::Int, "128", "most recent tokens kept per head"},
           {"sinks", ParamType::Int, "0", "first tokens always kept (0 in the paper)"}},
          [](const Params& p) {
            if (p.get_int("heavy") < 0 || p.get_int("recent") < 1 || p.get_int("sinks") < 0)
              throw InputError("--policy", "h2o", "heavy >= 0, recent >= 1 and sinks >= 0 expected");
            return std::make_unique<H2oPolicy>(p.get_int("heavy"), p.get_int("recent"), p.get_int("sinks"));
          }};
}

}  // namespace kvscope::policy
