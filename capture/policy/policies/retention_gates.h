// What the two retention-gate policies share (trimkv.cpp: per-head budget,
// TrimKV; dbtrimkv.cpp: one global budget, DBTrimKV, seed 002 §4.2): the gate
// file, log beta of every cached token computed once when it enters the
// cache (seed 002 §3.2: "we estimate it only once when the token enters"),
// recorded as the "retention" gate, and the eviction score
//   s_i = log( sum_{k=1..n} beta_i^(a_i + k - 1) )
//       = a_i log beta_i + log(1 - beta_i^n) - log(1 - beta_i),  a_i = t + 1 - pos_i
// with t the tokens fed so far and n the lookahead (seed 002 §4.2; n = 1 is
// TrimKV's a_i log beta_i, the official code's q_idx - kv_position).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "capture/gates/gate_nets.h"
#include "capture/policy/budget.h"
#include "capture/policy/policy.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

// log(1 - exp(x)) for x < 0, accurately on both sides of log(1/2).
inline double log1mexp(double x) {
  return x < std::log(0.5) ? std::log1p(-std::exp(x)) : std::log(-std::expm1(x));
}

inline double retention_score(double log_beta, int64_t age, int64_t lookahead) {
  if (lookahead <= 1) return double(age) * log_beta;
  const double lb = std::min(log_beta, -1e-9);  // beta == 1 in float: the sum is n
  return double(age) * lb + log1mexp(double(lookahead) * lb) - log1mexp(lb);
}

class RetentionGatePolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::hidden);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  RetentionGatePolicy(std::string name, std::string path, int64_t lookahead, int64_t window)
      : name_(std::move(name)), path_(std::move(path)), lookahead_(lookahead), window_(window) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    gates_ = gates::load_gates(path_, *s.model);
    if (gates_.kind != gates::GateKind::Retention && gates_.kind != gates::GateKind::RetentionGlobal)
      throw InputError(path_, "policy",
                       name_ + " needs retention gates (kind retention or retention-global); this file holds " +
                           gates::gate_kind_name(gates_.kind) + " gates");
    log_beta_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens,
                     std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<std::string> reason_names() const override {
    return {"new token", "lowest retention score"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"retention",
             "retention beta of the token at this kv head, from the " +
                 std::string(gates::gate_kind_name(gates_.kind)) +
                 " gate at admission; eviction score log(beta) * (t + 1 - position)",
             "1", std::numeric_limits<double>::quiet_NaN(), false}};
  }

  // Every new token's log beta from the layer's normalised input.
  void admit(AdmitContext& c) override {
    torch::NoGradGuard no_grad;
    torch::Tensor lb = gates::retention_log_beta(gates_, c.layer, c.in.hidden).contiguous();  // [K, n]
    const float* v = lb.data_ptr<float>();
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* dst = log_beta_.at(c.layer, h);
      for (int64_t i = 0; i < c.n; ++i) {
        const float x = v[h * c.n + i];
        dst[c.pos0 + i] = x;
        c.at(h, i).score = std::exp(x);
        c.decide.gate(0, c.layer, h, c.pos0 + i, std::exp(x), false);
      }
    }
  }

  const HeadScores& log_beta() const { return log_beta_; }

 protected:
  // Score of a held token (the last `window` positions fed score +inf: the
  // official sliding_window_size protection, 0 by default).
  double score(int64_t layer, int64_t kv_head, int64_t pos, int64_t fed) const {
    if (window_ > 0 && pos >= fed - window_) return std::numeric_limits<double>::infinity();
    return retention_score(log_beta_.at(layer, kv_head)[pos], fed + 1 - pos, lookahead_);
  }

  std::string name_, path_;
  int64_t lookahead_, window_;
  gates::GateSet gates_;
  HeadScores log_beta_;
};

}  // namespace kvscope::policy
