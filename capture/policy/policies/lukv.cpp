// lukv: LU-KV (Tang et al., "Predicting Future Utility: Global Combinatorial
// Optimization for Task-Agnostic KV Cache Eviction", 2026, arXiv 2602.08585;
// kvpress LUKVPress). Heads differ in how well their instantaneous scores
// predict long-horizon utility, so each (layer, kv head) gets its own budget
// from a budget curve profiled offline: curve[t][l][h] is the share of head
// (l, h)'s prompt entries pruned when the whole cache is compressed by
// (t + 1) %. At the end of the prefill, with ratio = 1 - budget / T:
//   t = clamp(round(100 ratio) - 1, 0, 98)       (round half to even)
//   ideal_h = clamp(1 - curve[t][l][h], 0, 1) * T
//   total = clamp(round(sum_h ideal_h), K, K T)
//   n_h = floor(ideal_h), plus one for the (total - sum floor) largest
//         fractional parts, then clamp(n_h, 1, T)
// and each head keeps its n_h best entries by the scorer's score, the first
// `keep_first` and last `keep_last` positions first (kvpress: scored max + 1). The
// curve is a .npy file of shape [99, L, K] (kvpress's and the official
// repository's format). docs/policies/lukv.md
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"
#include "core/common/npy_reader.h"

namespace kvscope::policy {

int64_t lukv_curve_row(double ratio) {
  const double idx = std::nearbyint(ratio * 100.0) - 1.0;  // Python's round: half to even
  return int64_t(std::clamp(idx, 0.0, 98.0));
}

std::vector<int64_t> lukv_head_counts(const std::vector<double>& prune, int64_t T) {
  const int64_t K = int64_t(prune.size());
  std::vector<double> ideal(static_cast<size_t>(K));
  double sum = 0;
  for (int64_t h = 0; h < K; ++h) {
    ideal[size_t(h)] = std::clamp(1.0 - prune[size_t(h)], 0.0, 1.0) * double(T);
    sum += ideal[size_t(h)];
  }
  const int64_t total = std::clamp<int64_t>(int64_t(std::nearbyint(sum)), K, K * T);
  std::vector<int64_t> n(static_cast<size_t>(K));
  int64_t floors = 0;
  for (int64_t h = 0; h < K; ++h) floors += n[size_t(h)] = int64_t(std::floor(ideal[size_t(h)]));
  // The remainder goes to the largest fractional parts (ties: the lower head).
  std::vector<int64_t> order(static_cast<size_t>(K));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ideal[size_t(a)] - double(n[size_t(a)]) > ideal[size_t(b)] - double(n[size_t(b)]);
  });
  for (int64_t i = 0; i < std::min(total - floors, K); ++i) ++n[size_t(order[size_t(i)])];
  for (int64_t& x : n) x = std::clamp<int64_t>(x, 1, T);
  return n;
}

namespace {

class LukvPolicy : public Policy {
 public:
  LukvPolicy(std::unique_ptr<HeadScorer> scorer, int64_t budget, std::string curve_path,
             Protection protect)
      : scorer_(std::move(scorer)),
        budget_(budget),
        curve_path_(std::move(curve_path)),
        protect_(protect) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    scorer_->setup(s);
    L_ = s.model->n_layers, K_ = s.model->n_kv_heads;
    scores_.resize(L_, K_, s.max_tokens, std::numeric_limits<float>::quiet_NaN());
    const NpyArray curve = read_npy(curve_path_);
    const std::vector<int64_t> want = {99, L_, K_};
    if (curve.shape != want)
      throw InputError(curve_path_, "shape",
                       "[99, " + std::to_string(L_) + ", " + std::to_string(K_) +
                           "] expected (99 compression ratios x the model's layers x kv heads), "
                           "got " +
                           shape_text(curve.shape));
    for (double v : curve.data)
      if (!std::isfinite(v))
        throw InputError(curve_path_, "values", "finite prune ratios expected, got a NaN or inf");
    row_ = lukv_curve_row(1.0 - double(budget_) / double(s.prompt_tokens));
    prune_.assign(curve.data.begin() + row_ * L_ * K_, curve.data.begin() + (row_ + 1) * L_ * K_);
  }

  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "outside the head's LU-KV budget"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{scorer_->score_name(), scorer_->score_meaning(), "score",
             std::numeric_limits<double>::quiet_NaN(), true}};
  }
  cache::StatsNeeds stats_needs() const override { return scorer_->stats_needs(); }
  std::string budget_kind() const override { return "none"; }
  int64_t budget() const override { return budget_; }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"curve_row", double(row_)}};
  }
  std::string describe() const override {
    return "per-head budgets from the LU-KV curve " + curve_path_ + " (row " +
           std::to_string(row_) + "), scorer " + scorer_->score_name() + ", " +
           std::to_string(protect_.sinks) + " sinks and " + std::to_string(protect_.recent) +
           " recent kept first; prefill only";
  }

  void after_attention(LayerContext& c) override {
    scorer_->observe(c);
    if (!c.prefill || !scorer_->compresses(c)) return;
    const int64_t T = c.tokens_fed();
    if (budget_ >= T) return;  // no compression (kvpress: compression_ratio <= 0)
    const std::vector<int64_t> n = lukv_head_counts(
        std::vector<double>(prune_.begin() + c.layer * K_, prune_.begin() + (c.layer + 1) * K_), T);
    for (int64_t h = 0; h < K_; ++h) evict_head(c, h, n[size_t(h)]);
  }

 private:
  static std::string shape_text(const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  }

  // Keeps the head's n best: LU-KV's sinks and window first, then the
  // scorer's own protected entries, then the highest scores; ties (and
  // within the protected) the older position first (kvpress: a stable
  // descending argsort).
  void evict_head(LayerContext& c, int64_t h, int64_t n) {
    float* s = scores_.at(c.layer, h);
    scorer_->score(c, h, s);
    const std::vector<int32_t>& held = c.cache.positions(c.layer, h, 0);
    const int64_t fed = c.tokens_fed();
    const Protection own = scorer_->protection();
    auto rank = [&](int32_t pos) {
      return protect_.protects(pos, fed) ? 0 : own.protects(pos, fed) ? 1 : 2;
    };
    std::vector<int32_t> order(held.begin(), held.end());
    std::sort(order.begin(), order.end());
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (rank(a) != rank(b)) return rank(a) < rank(b);
      return rank(a) == 2 && s[a] > s[b];
    });
    for (int32_t pos : held) c.decide.gate(0, c.layer, h, pos, s[pos], false);
    std::vector<int64_t> leave(order.begin() + std::min<int64_t>(n, int64_t(order.size())),
                               order.end());
    std::sort(leave.begin(), leave.end());
    evict_all(c.decide, c.layer, h, leave, s, 1);
  }

  std::unique_ptr<HeadScorer> scorer_;
  int64_t budget_;
  std::string curve_path_;
  Protection protect_;
  int64_t L_ = 0, K_ = 0, row_ = 0;
  std::vector<double> prune_;  // the curve's row: [L][K] prune ratios
  HeadScores scores_;
};

}  // namespace

PolicyDescriptor lukv_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "expected_attention",
       "the score within a head: " + scorer_names()},
      {"curve", ParamType::String, "",
       "the budget curve: a .npy of shape [99, layers, kv heads], prune ratios per compression "
       "ratio 1 %..99 % (required)"},
      {"budget", ParamType::Int, "256",
       "entries kept per head on average; picks the curve's row 100 (1 - budget/T) - 1 (a "
       "fraction of the prompt: budget=0.25)",
       1},
      {"keep_first", ParamType::Int, "4", "first positions kept before any score (kvpress sink)",
       0},
      {"keep_last", ParamType::Int, "1",
       "last prompt positions kept before any score (kvpress window)", 0}};
  params = with_scorer_params(std::move(params));
  return {"lukv",
          "LU-KV: per-(layer, kv head) budgets from a curve profiled offline, around a scorer",
          "Tang et al., Predicting Future Utility: Global Combinatorial Optimization for "
          "Task-Agnostic KV Cache Eviction, 2026 (kvpress LUKVPress)",
          "docs/policies/lukv.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            const std::string curve = p.get_string("curve");
            if (curve.empty())
              throw InputError("--policy", "lukv:curve",
                               "a budget curve file is required (.npy, [99, layers, kv heads]; "
                               "`kvscope train --policy lukv` profiles one; resources/gates "
                               "ships SnapKV's for stories260K and SmolLM2)");
            return std::make_unique<LukvPolicy>(
                make_named_scorer("lukv", p), p.get_int("budget"), curve,
                Protection{p.get_int("keep_first"), p.get_int("keep_last")});
          }};
}

}  // namespace kvscope::policy
