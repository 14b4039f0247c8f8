// cap: CAPKV (arXiv 2604.25975), as kvpress's CapPress computes it. An
// entry is worth keeping when the future queries will attend it and when its
// value adds a direction the other kept values do not already span: per query
// head r of the kv head's group, with mu_r the mean of the queries seen so
// far (pre-RoPE, sinks left out) rotated by RoPE averaged over the next
// `n_future` positions (expected_attention.md), over the held non-sink entries
//   w_j = exp(tau cos(mu_r, k_j) - max_j tau cos(mu_r, k_j)),
//   A_r = I + sum_j (w_j + epsilon) v_j v_j^T,
//   s_j = w_j v_j^T A_r^-1 v_j        (a weighted leverage of the value),
// averaged over the group's heads; the first `sinks` entries are kept.
// docs/policies/cap.md
#include <torch/torch.h>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/query_moments.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct CapOptions {
  double tau = 5.0, epsilon = 1e-6;
  int64_t n_future = 512, sinks = 4;
};

class CapScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  explicit CapScorer(CapOptions o) : o_(o) {}
  void setup(const PolicySetup& s) override {
    H_ = s.model->n_heads, K_ = s.model->n_kv_heads;
    moments_.setup(*s.model, o_.sinks, false);
  }
  std::string score_name() const override { return "cap"; }
  std::string score_meaning() const override {
    return "query-aligned value leverage w v^T (I + sum w v v^T)^-1 v, mean over the group";
  }
  Protection protection() const override { return {o_.sinks, 0}; }
  void observe(LayerContext& c) override {
    moments_.add(c.layer, c.in.q, c.pos0, c.tokens_fed());
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const HeldRows all = held_rows(c.cache, c.layer, kv_head);
    std::vector<int64_t> rest;
    for (int32_t pos : all.pos)
      if (pos >= o_.sinks) rest.push_back(pos);
    if (rest.empty() || moments_.count(c.layer) == 0) return;
    const HeldRows r = subset_rows(all, rest);
    const int64_t R = H_ / K_, d = r.keys.size(1);
    const torch::Tensor rbar = moments_.averaged_rotation(c.tokens_fed(), o_.n_future);
    const torch::Tensor anchor = moments_.mean(c.layer).matmul(rbar.t()).to(torch::kFloat32)
                                     .narrow(0, kv_head * R, R);  // [R, d]
    const torch::Tensor unit_k = r.keys / r.keys.norm(2, -1, true).clamp_min(1e-12);
    const torch::Tensor unit_a = anchor / anchor.norm(2, -1, true).clamp_min(1e-12);
    const torch::Tensor stat = unit_a.matmul(unit_k.t()).clamp(-1.0, 1.0);  // [R, m]
    torch::Tensor logits = o_.tau * stat;
    const torch::Tensor w = (logits - std::get<0>(logits.max(-1, true))).exp();  // [R, m]
    const torch::Tensor scaled = r.values.unsqueeze(0) * (w + o_.epsilon).sqrt().unsqueeze(-1);
    const torch::Tensor A = torch::eye(d).unsqueeze(0) + scaled.transpose(1, 2).matmul(scaled);
    const torch::Tensor vt = r.values.t().unsqueeze(0).expand({R, d, r.size()});  // [R, d, m]
    const torch::Tensor leverage = (vt * torch::linalg_solve(A, vt)).sum(1);      // [R, m]
    const torch::Tensor s = (w * leverage).mean(0).contiguous();
    const float* p = s.data_ptr<float>();
    for (int64_t j = 0; j < r.size(); ++j) out[r.pos[size_t(j)]] = p[j];
  }

 private:
  CapOptions o_;
  int64_t H_ = 0, K_ = 0;
  QueryMoments moments_;
};

std::vector<ParamSpec> cap_params() {
  return {{"tau", ParamType::Float, "5", "temperature of the query-key alignment", 0, 1e6},
          {"n_future", ParamType::Int, "512", "future positions the RoPE rotation is averaged over", 1},
          {"sinks", ParamType::Int, "4", "first tokens always kept and left out of the statistics"},
          {"cap_epsilon", ParamType::Float, "1e-6",
           "added to the weights inside the capacity matrix (kvpress: epsilon)", 0, 1}};
}

std::unique_ptr<HeadScorer> make_cap(const Params& p) {
  CapOptions o;
  o.tau = p.get_float("tau"), o.n_future = p.get_int("n_future"), o.sinks = p.get_int("sinks");
  o.epsilon = p.get_float("cap_epsilon");
  if (o.sinks < 0) throw InputError("--policy", "cap:sinks", "must be >= 0");
  return std::make_unique<CapScorer>(o);
}

}  // namespace

ScorerDescriptor cap_scorer() {
  return {"cap", cap_params(), make_cap};
}

PolicyDescriptor cap_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head, sinks included"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step, the anchor moving with the queries (false: prefill "
       "only, as kvpress)"}};
  for (const ParamSpec& s : cap_params()) params.push_back(s);
  return {"cap",
          "CAPKV: query-aligned leverage of the values (an entry stays when attended and when its "
          "value is not already spanned)",
          "CAPKV (arXiv 2604.25975; kvpress CapPress)",
          "docs/policies/cap.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1) throw InputError("--policy", "cap:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_cap(p),
                                                  std::vector<int64_t>{p.get_int("budget")},
                                                  p.get_bool("decode"), "lowest CAPKV score");
          }};
}

}  // namespace kvscope::policy
