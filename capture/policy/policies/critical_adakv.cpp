// critical_adakv: CriticalAdaKV (Feng et al., "Identify Critical KV Cache in
// LLM Inference from an Output Perturbation Perspective", 2025), as kvpress's
// CriticalAdaKVPress computes it: Ada-KV's head budgets from the base score,
// CriticalKV's two stages inside each head. Per layer, with B the budget per
// head and s the base scorer's scores (its protected entries on top):
//   1. safeguard: each head's top floor(alpha B) (at least 1) entries count first;
//   2. head budgets: the layer's best B K entries by s (safeguards first),
//      wherever they are, give each head its budget b_h (Ada-KV);
//   3. stage 1: each head's top floor(b_h first_stage) entries by s stay;
//   4. stage 2: the rest of b_h by (s + epsilon) mean_r ||v W_o^r||_1.
// docs/policies/critical_adakv.md
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/output_projection.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct CriticalAdaOptions {
  int64_t budget = 256;
  double alpha = 0.2, first_stage = 0.5, epsilon = 1e-4;
  bool decode = true;
};

class CriticalAdaKvPolicy : public Policy {
 public:
  CriticalAdaKvPolicy(std::unique_ptr<HeadScorer> base, CriticalAdaOptions o)
      : base_(std::move(base)), o_(o) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    base_->setup(s);
    H_ = s.model->n_heads, K_ = s.model->n_kv_heads;
    norms_.setup(per_head_output_projections(s.weights, H_, s.model->head_dim, "critical_adakv"),
                 K_, s.max_tokens);
    scores_.resize(s.model->n_layers, K_, s.max_tokens, std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "outside the head's critical budget"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"critical_adakv", "(base score + epsilon) x ||W_o v||_1, mean over the group", "score",
             std::numeric_limits<double>::quiet_NaN(), true}};
  }
  cache::StatsNeeds stats_needs() const override { return base_->stats_needs(); }
  std::string budget_kind() const override { return o_.decode ? "layer" : "none"; }
  int64_t budget() const override { return setup_.model ? o_.budget * K_ : o_.budget; }
  HeldLimit held_limit(const LayerContext& c) const override {
    return compressing(c) ? HeldLimit{-1, o_.budget * K_} : HeldLimit{};
  }

  void after_attention(LayerContext& c) override {
    base_->observe(c);
    if (!compressing(c)) return;
    int64_t held = 0;
    for (int64_t h = 0; h < K_; ++h) held += c.cache.count(c.layer, h, 0);
    if (held <= o_.budget * K_) return;
    evict(c);
  }

 private:
  bool compressing(const LayerContext& c) const {
    return base_->compresses(c) && (c.prefill || o_.decode);
  }

  struct Entry {
    float base;  // the base score, protected entries +inf
    int64_t head;
    int32_t pos;
  };
  // Best first; ties keep the newer, then the lower head.
  static bool better(const Entry& a, const Entry& b) {
    if (a.base != b.base) return a.base > b.base;
    if (a.pos != b.pos) return a.pos > b.pos;
    return a.head < b.head;
  }

  void evict(LayerContext& c) {
    const Protection keep = base_->protection();
    const int64_t B = o_.budget;
    int64_t safe = int64_t(std::floor(o_.alpha * double(B)));
    if (o_.alpha > 0) safe = std::max<int64_t>(1, safe);
    // Per head: its entries best first by the base score.
    std::vector<std::vector<Entry>> heads(static_cast<size_t>(K_));
    std::vector<std::vector<int32_t>> rows(static_cast<size_t>(K_));
    for (int64_t h = 0; h < K_; ++h) {
      float* s = scores_.at(c.layer, h);
      base_->score(c, h, s);
      rows[size_t(h)] = c.cache.positions(c.layer, h, 0);
      std::sort(rows[size_t(h)].begin(), rows[size_t(h)].end());
      for (int32_t pos : rows[size_t(h)]) {
        float b = base_->log_scores() ? std::exp(s[pos]) : s[pos];
        if (keep.protects(pos, c.tokens_fed())) b = std::numeric_limits<float>::infinity();
        heads[size_t(h)].push_back({b, h, pos});
      }
      std::sort(heads[size_t(h)].begin(), heads[size_t(h)].end(), better);
    }
    // Ada-KV's head budgets: safeguards first, then the layer's best.
    std::vector<Entry> pool;
    std::vector<int64_t> budget(static_cast<size_t>(K_), 0);
    int64_t room = B * K_;
    for (int64_t h = 0; h < K_; ++h) {
      const auto& v = heads[size_t(h)];
      const int64_t own = std::min<int64_t>(safe, int64_t(v.size()));
      budget[size_t(h)] = own;
      room -= own;
      pool.insert(pool.end(), v.begin() + own, v.end());
    }
    std::sort(pool.begin(), pool.end(), better);
    for (int64_t i = 0; i < std::min<int64_t>(std::max<int64_t>(0, room), int64_t(pool.size()));
         ++i)
      ++budget[size_t(pool[size_t(i)].head)];
    for (int64_t h = 0; h < K_; ++h)
      keep_head(c, h, heads[size_t(h)], rows[size_t(h)], budget[size_t(h)]);
  }

  // CriticalKV's two stages inside one head: keep `b` entries.
  void keep_head(LayerContext& c, int64_t h, const std::vector<Entry>& best,
                 const std::vector<int32_t>& rows, int64_t b) {
    const int64_t m = int64_t(rows.size());
    if (m <= b) return;
    norm_.resize(size_t(m));
    norms_.of(c.cache, c.layer, h, rows, norm_.data());
    float* s = scores_.at(c.layer, h);
    std::vector<std::pair<float, int32_t>> stage2;  // (rescaled, pos)
    const int64_t first = int64_t(double(b) * o_.first_stage);
    std::vector<char> stays(size_t(c.tokens_fed()), 0);
    for (int64_t i = 0; i < first; ++i) stays[size_t(best[size_t(i)].pos)] = 1;
    for (int64_t j = 0; j < m; ++j) {
      const int32_t pos = rows[size_t(j)];
      const float base = base_->log_scores() ? std::exp(s[pos]) : s[pos];
      s[pos] = (base + float(o_.epsilon)) * norm_[size_t(j)];
      c.decide.gate(0, c.layer, h, pos, s[pos], c.step % 16 == 0);
      const bool pinned = base_->protection().protects(pos, c.tokens_fed());
      if (!stays[size_t(pos)])
        stage2.push_back({pinned ? std::numeric_limits<float>::infinity() : s[pos], pos});
    }
    std::sort(stage2.begin(), stage2.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second > b.second;
    });
    std::vector<int64_t> out;
    for (size_t i = size_t(std::max<int64_t>(0, b - first)); i < stage2.size(); ++i)
      out.push_back(stage2[i].second);
    std::sort(out.begin(), out.end());
    evict_all(c.decide, c.layer, h, out, s, 1);
  }

  std::unique_ptr<HeadScorer> base_;
  CriticalAdaOptions o_;
  int64_t H_ = 0, K_ = 0;
  OutputNorms norms_;
  std::vector<float> norm_;  // scratch: one head's norms
  HeadScores scores_;
};

}  // namespace

PolicyDescriptor critical_adakv_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "snapkv", "base scorer: " + scorer_names()},
      {"budget", ParamType::Int, "256", "mean entries per head; the layer holds budget x kv heads"},
      {"alpha", ParamType::Float, "0.2",
       "safeguard: every head keeps its top floor(alpha x budget) entries", 0, 1},
      {"first_stage", ParamType::Float, "0.5",
       "share of each head's budget kept by the base score alone", 0, 1},
      {"critical_epsilon", ParamType::Float, "1e-4",
       "added to the base score before the rescaling (kvpress: epsilon)", 0, 1e6},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  params = with_scorer_params(std::move(params));
  return {"critical_adakv",
          "CriticalAdaKV: Ada-KV's head budgets from a scorer, CriticalKV's two stages inside "
          "each head",
          "Feng et al., Identify Critical KV Cache in LLM Inference from an Output Perturbation "
          "Perspective, 2025 (kvpress CriticalAdaKVPress)",
          "docs/policies/critical_adakv.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            CriticalAdaOptions o;
            o.budget = p.get_int("budget"), o.alpha = p.get_float("alpha");
            o.first_stage = p.get_float("first_stage"), o.epsilon = p.get_float("critical_epsilon");
            o.decode = p.get_bool("decode");
            if (o.budget < 1) throw InputError("--policy", "critical_adakv:budget", "must be >= 1");
            return std::make_unique<CriticalAdaKvPolicy>(make_named_scorer("critical_adakv", p), o);
          }};
}

}  // namespace kvscope::policy
