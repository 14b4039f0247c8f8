// expected_attention: Expected Attention (Devoto et al., "Expected Attention:
// KV Cache Compression by Estimating Attention from Future Queries
// Distribution", 2025), as kvpress's ExpectedAttentionPress defines it.
// Future queries are modelled as Gaussian: mean mu and covariance Sigma of the
// pre-RoPE queries seen so far (the first `sinks` tokens left out), rotated by
// the RoPE matrix averaged over the next `n_future` positions,
//   Rbar = mean_t R(t),  mu' = Rbar mu,  Sigma' = Rbar Sigma Rbar^T.
// Since q ~ N(mu', Sigma'), E[exp(s q.k)] = exp(s mu'.k + s^2/2 k^T Sigma' k):
//   z(k) = s mu'.k + s^2/2 k^T Sigma' k,  a = softmax_k(z) per query head,
//   score(k) = (mean over the group's heads of a + epsilon) * ||v||_2,
// kept as log score(k) (see score()), and the first `sinks` tokens are kept.
// docs/policies/expected_attention.md
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "capture/gates/gate_set.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/query_moments.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"
#include "kernels/cpu/float_loops.h"

namespace kvscope::policy {

namespace {

struct EaOptions {
  int64_t n_future = 512, sinks = 4, refresh = 16;
  bool covariance = true, vnorm = true;
  double epsilon = 0.0;
  // A query-stats file (kvscope train --policy query-stats): calibrated mean
  // and covariance in place of the running ones (kvpress
  // ExpectedAttentionStatsPress).
  std::string stats;
};

class ExpectedAttentionScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  explicit ExpectedAttentionScorer(EaOptions o) : o_(o) {}

  void setup(const PolicySetup& s) override {
    const model::ModelConfig& m = *s.model;
    L_ = m.n_layers, H_ = m.n_heads, K_ = m.n_kv_heads, d_ = m.head_dim, M_ = s.max_tokens;
    moments_.setup(m, o_.sinks, true);
    fixed_mu_.clear(), fixed_cov_.clear();
    if (!o_.stats.empty()) {
      const gates::GateSet g = gates::load_gates(o_.stats, m);
      if (g.kind != gates::GateKind::QueryStats)
        throw InputError(o_.stats, "policy",
                         std::string("expected_attention_stats needs query statistics (kind "
                                     "query-stats); this file holds ") +
                             gates::gate_kind_name(g.kind) + " gates");
      for (int64_t l = 0; l < L_; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        fixed_mu_.push_back(g.param(p + "query_mean").to(torch::kFloat64));
        fixed_cov_.push_back(g.param(p + "query_cov").to(torch::kFloat64));
      }
    }
    mu_.assign(size_t(L_), torch::Tensor());
    cov_.assign(size_t(L_), torch::Tensor());
    refreshed_at_.assign(size_t(L_), -1);
    log_vnorm_.resize(L_, K_, M_);
    logits_.assign(size_t(L_ * H_ * M_), 0.0f);
  }
  std::string score_name() const override { return "expected_attention"; }
  std::string score_meaning() const override {
    return "natural log of (expected attention of future queries (Gaussian, averaged RoPE) + "
           "epsilon) times ||v||";
  }
  Protection protection() const override { return {o_.sinks, 0}; }
  bool log_scores() const override { return true; }

  void observe(LayerContext& c) override {
    moments_.add(c.layer, c.in.q, c.pos0, c.tokens_fed());
    record_value_norms(c);
    if (!c.prompt_complete || (fixed_mu_.empty() && moments_.count(c.layer) == 0)) return;
    // The statistics move with every query: re-derive them and every held
    // key's logit every `refresh` decode steps (and at the prefill); in
    // between only the new keys are scored with the current statistics.
    const bool refresh = c.prefill || refreshed_at_[size_t(c.layer)] < 0 ||
                         c.step - refreshed_at_[size_t(c.layer)] >= o_.refresh;
    if (refresh) {
      refresh_statistics(c);
      for (int64_t h = 0; h < K_; ++h) {
        const std::vector<int32_t>& held = c.cache.positions(c.layer, h, 0);
        torch::Tensor keys = torch::empty({int64_t(held.size()), d_}, torch::kFloat32);
        std::vector<float> value(static_cast<size_t>(d_));
        for (size_t j = 0; j < held.size(); ++j)
          c.cache.read_entry(c.layer, h, held[j], keys.data_ptr<float>() + int64_t(j) * d_,
                             value.data());
        write_logits(c, h, keys, held);
      }
    } else {
      const torch::Tensor k = c.in.k.to(torch::kFloat32).contiguous();  // [n, K, hd]
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t h = 0; h < K_; ++h)
          write_logit(c, h, k.data_ptr<float>() + (i * K_ + h) * d_, c.pos0 + i);
    }
  }

  // The score is kept as a natural log. The expected attention of a key is a
  // softmax over logits that span hundreds of nats on real models (stories260K
  // layer 1: scores of 1e-80 next to 1): (a + epsilon) ||v|| in float32 is 0
  // for most keys (below 1.4e-45), the ranking then collapses into ties broken
  // by position, and the kept set stops being the paper's. log a = z - lse(z)
  // never underflows, and log is monotone, so the kept set is kvpress's exact
  // (infinite precision) one.
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const int64_t R = H_ / K_;
    keys_.clear();
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0))
      if (pos >= o_.sinks)
        keys_.push_back(pos);
      else
        out[pos] = std::numeric_limits<float>::max();  // protected
    // log of the group's mean attention: logsumexp over its heads of
    // log softmax(z), minus log R.
    lse_.resize(size_t(R)), rows_.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r) {
      const float* z = rows_[size_t(r)] = logit_row(c.layer, kv_head * R + r);
      double top = -std::numeric_limits<double>::infinity(), total = 0;
      for (int32_t pos : keys_) top = std::max(top, double(z[pos]));
      for (int32_t pos : keys_) total += std::exp(double(z[pos]) - top);
      lse_[size_t(r)] = top + std::log(total);
    }
    const float* log_vn = log_vnorm_.at(c.layer, kv_head);
    const double log_eps = std::log(o_.epsilon), log_r = std::log(double(R));
    for (int32_t pos : keys_) {
      double top = -std::numeric_limits<double>::infinity(), total = 0;
      for (int64_t r = 0; r < R; ++r)
        top = std::max(top, double(rows_[size_t(r)][pos]) - lse_[size_t(r)]);
      for (int64_t r = 0; r < R; ++r)
        total += std::exp(double(rows_[size_t(r)][pos]) - lse_[size_t(r)] - top);
      double s = top + std::log(total) - log_r;
      if (o_.vnorm) s = log_add_exp(s, log_eps) + double(log_vn[pos]);
      // ||v|| = 0 gives log 0: the lowest finite float (views plot the range).
      out[pos] = float(std::max(s, double(std::numeric_limits<float>::lowest())));
    }
  }

 private:
  // log(exp(a) + exp(b)) without overflow or underflow; log(0) = -inf works.
  static double log_add_exp(double a, double b) {
    if (a < b) std::swap(a, b);
    if (b == -std::numeric_limits<double>::infinity()) return a;
    return a + std::log1p(std::exp(b - a));
  }

  float* logit_row(int64_t layer, int64_t q_head) {
    return logits_.data() + (layer * H_ + q_head) * M_;
  }

  void refresh_statistics(LayerContext& c) {
    const bool fixed = !fixed_mu_.empty();
    const torch::Tensor mu = fixed ? fixed_mu_[size_t(c.layer)] : moments_.mean(c.layer);  // [H, d]
    const torch::Tensor cov =
        fixed ? fixed_cov_[size_t(c.layer)] : moments_.covariance(c.layer);  // [H, d, d]
    const torch::Tensor rbar = moments_.averaged_rotation(c.tokens_fed(), o_.n_future);
    mu_[size_t(c.layer)] = torch::matmul(mu, rbar.t()).to(torch::kFloat32);
    cov_[size_t(c.layer)] =
        torch::matmul(rbar, torch::matmul(cov, rbar.t())).to(torch::kFloat32);  // [H, d, d]
    refreshed_at_[size_t(c.layer)] = c.step;
  }

  // Logits z of `keys` [m, d] (positions `pos`) for the group of kv head h.
  void write_logits(LayerContext& c, int64_t h, const torch::Tensor& keys,
                    const std::vector<int32_t>& pos) {
    if (pos.empty()) return;
    const int64_t R = H_ / K_;
    const double s = c.in.scale;
    torch::Tensor mu = mu_[size_t(c.layer)].narrow(0, h * R, R);  // [R, d]
    torch::Tensor z = torch::matmul(mu, keys.t()) * s;            // [R, m]
    if (o_.covariance) {
      torch::Tensor cov = cov_[size_t(c.layer)].narrow(0, h * R, R);  // [R, d, d]
      z += torch::einsum("md,rde,me->rm", {keys, cov, keys}) * (s * s / 2);
    }
    z = z.contiguous();
    for (int64_t r = 0; r < R; ++r) {
      float* row = logit_row(c.layer, h * R + r);
      const float* zr = z.data_ptr<float>() + r * int64_t(pos.size());
      for (size_t j = 0; j < pos.size(); ++j) row[pos[j]] = zr[j];
    }
  }

  // The logit of one new key k [d] at `pos`, as write_logits computes it, in
  // plain loops (a decode step's per-head tensor ops cost ten times more).
  void write_logit(LayerContext& c, int64_t h, const float* k, int64_t pos) {
    const int64_t R = H_ / K_;
    const float s = float(c.in.scale);
    const float* mu = mu_[size_t(c.layer)].data_ptr<float>();
    const float* cov = cov_[size_t(c.layer)].data_ptr<float>();
    row_.resize(size_t(d_));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t q = h * R + r;
      float z = kernels::cpu::dot(mu + q * d_, k, d_) * s;
      if (o_.covariance) {
        const float* cq = cov + q * d_ * d_;  // Sigma'_q, [d, d]
        for (int64_t i = 0; i < d_; ++i) row_[size_t(i)] = kernels::cpu::dot(cq + i * d_, k, d_);
        z += kernels::cpu::dot(row_.data(), k, d_) * (s * s / 2);
      }
      logit_row(c.layer, q)[pos] = z;
    }
  }

  // log ||v|| of the step's new entries (the score adds it in log space).
  void record_value_norms(const LayerContext& c) {
    const torch::Tensor v = c.in.v.to(torch::kFloat32).contiguous();  // [n, K, hd]
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < K_; ++h) {
        const float* row = v.data_ptr<float>() + (i * K_ + h) * d_;
        log_vnorm_.at(c.layer, h)[c.pos0 + i] =
            float(std::log(double(std::sqrt(kernels::cpu::dot(row, row, d_)))));
      }
  }

  EaOptions o_;
  int64_t L_ = 0, H_ = 0, K_ = 0, d_ = 0, M_ = 0;
  QueryMoments moments_;
  std::vector<torch::Tensor> fixed_mu_, fixed_cov_;  // per layer, from a query-stats file
  std::vector<torch::Tensor> mu_, cov_;
  std::vector<int64_t> refreshed_at_;
  HeadScores log_vnorm_;       // log ||v|| per entry
  std::vector<float> logits_;  // [L, H, M]
  std::vector<int32_t> keys_;  // scratch of score()
  std::vector<double> lse_;
  std::vector<const float*> rows_;  // the group's logit rows, for score()
  std::vector<float> row_;          // scratch of write_logit()
};

std::vector<ParamSpec> ea_params() {
  return {
      {"n_future", ParamType::Int, "512", "future positions the RoPE rotation is averaged over"},
      {"sinks", ParamType::Int, "4",
       "first tokens always kept and left out of the query statistics"},
      {"covariance", ParamType::Bool, "true", "use the query covariance term (false: mean only)"},
      {"vnorm", ParamType::Bool, "true", "multiply by ||v||_2 (false: expected attention alone)"},
      {"epsilon", ParamType::Float, "0",
       "added to the expected attention before the ||v|| rescaling", 0, 1e6},
      {"refresh", ParamType::Int, "16", "decode steps between re-derivations of the statistics"}};
}

std::unique_ptr<HeadScorer> make_ea(const Params& p, const std::string& stats = "") {
  EaOptions o;
  o.stats = stats;
  o.n_future = p.get_int("n_future");
  o.sinks = p.get_int("sinks");
  o.covariance = p.get_bool("covariance");
  o.vnorm = p.get_bool("vnorm");
  o.epsilon = p.get_float("epsilon");
  o.refresh = p.get_int("refresh");
  if (o.n_future < 1) throw InputError("--policy", "n_future", "must be >= 1");
  if (o.sinks < 0) throw InputError("--policy", "sinks", "must be >= 0");
  if (o.refresh < 1) throw InputError("--policy", "refresh", "must be >= 1");
  if (!(o.epsilon >= 0)) throw InputError("--policy", "epsilon", "must be >= 0");
  return std::make_unique<ExpectedAttentionScorer>(o);
}

}  // namespace

ScorerDescriptor expected_attention_scorer() {
  return {"expected_attention", ea_params(), [](const Params& p) { return make_ea(p); }};
}

PolicyDescriptor expected_attention_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head, sinks included"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  for (const ParamSpec& s : ea_params()) params.push_back(s);
  return {
      "expected_attention",
      "expected attention of future queries (Gaussian model, averaged RoPE) times ||v||, per head",
      "Devoto et al., Expected Attention: KV Cache Compression by Estimating Attention from Future "
      "Queries "
      "Distribution, 2025 (kvpress ExpectedAttentionPress)",
      "docs/policies/expected_attention.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_int("budget") <= p.get_int("sinks"))
          throw InputError("--policy", "expected_attention:budget", "must be > sinks");
        return std::make_unique<ScoredPolicy>(make_ea(p), std::vector<int64_t>{p.get_int("budget")},
                                              p.get_bool("decode"), "lowest expected attention");
      }};
}

PolicyDescriptor expected_attention_stats_descriptor() {
  std::vector<ParamSpec> params = {
      {"gates", ParamType::String, "",
       "query statistics file (kvscope train --policy query-stats); default: the shipped one of "
       "the model"},
      {"budget", ParamType::Int, "256", "entries kept per head, sinks included"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  for (const ParamSpec& s : ea_params()) params.push_back(s);
  PolicyDescriptor d{
      "expected_attention_stats",
      "expected attention with the query mean and covariance calibrated offline instead of the "
      "prompt's own",
      "Devoto et al., Expected Attention, 2025 (kvpress ExpectedAttentionStatsPress)",
      "docs/policies/expected_attention_stats.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("gates").empty())
          throw InputError("--policy", "expected_attention_stats:gates",
                           "a query-stats file is required (kvscope train --policy query-stats)");
        if (p.get_int("budget") <= p.get_int("sinks"))
          throw InputError("--policy", "expected_attention_stats:budget", "must be > sinks");
        return std::make_unique<ScoredPolicy>(make_ea(p, p.get_string("gates")),
                                              std::vector<int64_t>{p.get_int("budget")},
                                              p.get_bool("decode"), "lowest expected attention");
      }};
  d.gate_kinds = {"query-stats"};
  return d;
}

}  // namespace kvscope::policy
