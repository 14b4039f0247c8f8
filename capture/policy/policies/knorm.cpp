// knorm: key-norm eviction (Devoto et al., "A Simple and Effective L2
// Norm-Based Strategy for KV Cache Compression", EMNLP 2024). Keys with a low
// L2 norm draw high attention, so each head keeps the `budget` keys of lowest
// norm: score = -||k||_2, taken before RoPE (a rotation: the same norm).
// Equal layer inputs give equal keys, so their norms tie exactly (the older
// one leaves): a row seen before in the layer reuses its norms, because the
// same key computed in a prefill GEMM and in a decode GEMV differs in its
// last bits, by an amount that differs between CPUs. Needs no attention.
// docs/policies/knorm.md
#include <cmath>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class KnormScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n = cache::StatsNeeds::reading(&cache::StatsNeeds::key_pre_rope);
    n.hidden = true;  // to know a key seen before (observe)
    return n;
  }
  void setup(const PolicySetup& s) override {
    norms_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
    first_seen_.assign(size_t(s.model->n_layers), {});
  }
  std::string score_name() const override { return "knorm_negative_key_norm"; }
  std::string score_meaning() const override {
    return "-||k||_2 of the key before RoPE (= the cached key's norm; higher = kept)";
  }
  // Every forward pass: keeping the lowest norms chunk by chunk keeps the
  // lowest norms of the whole prompt.
  bool compresses(const LayerContext&) const override { return true; }

  void observe(LayerContext& c) override {
    const torch::Tensor k = c.in.k_pre_rope.to(torch::kFloat32).contiguous();  // [n, K, hd]
    const torch::Tensor x = c.in.hidden.to(torch::kFloat32).contiguous();      // [n, D]
    const float* kp = k.data_ptr<float>();
    const int64_t K = c.cache.n_kv_heads(), hd = c.cache.head_dim(), D = x.size(1);
    std::vector<float> mine(static_cast<size_t>(K));
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t pos = c.pos0 + i;
      for (int64_t h = 0; h < K; ++h) mine[size_t(h)] = norm(kp + (i * K + h) * hd, hd);
      const std::string_view input(reinterpret_cast<const char*>(x.data_ptr<float>() + i * D),
                                   size_t(D) * sizeof(float));
      auto [first, fresh] =
          first_seen_.at(size_t(c.layer)).try_emplace(std::hash<std::string_view>{}(input), pos);
      const bool same = !fresh && first->second != pos && agrees(c, first->second, mine);
      for (int64_t h = 0; h < K; ++h)
        norms_.at(c.layer, h)[pos] = same ? norms_.at(c.layer, h)[first->second] : -mine[size_t(h)];
    }
  }
  Subsets subsets() const override { return Subsets::Entry; }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* n = norms_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) out[pos] = n[pos];
  }

 private:
  static float norm(const float* k, int64_t hd) {
    double s = 0;
    for (int64_t d = 0; d < hd; ++d) s += double(k[d]) * k[d];
    return float(std::sqrt(s));
  }
  // The row at `first` had the same input (by hash): its norms are `mine`
  // up to rounding. The check guards against a hash collision and a position
  // written again since (a reconstruction pass).
  bool agrees(const LayerContext& c, int64_t first, const std::vector<float>& mine) const {
    for (size_t h = 0; h < mine.size(); ++h) {
      const float theirs = -norms_.at(c.layer, int64_t(h))[first];
      if (!(std::fabs(mine[h] - theirs) <= 1e-5f * mine[h])) return false;
    }
    return true;
  }

  HeadScores norms_;
  // [layer]: hash of a layer input row -> the first position it was fed at.
  std::vector<std::unordered_map<uint64_t, int64_t>> first_seen_;
};

std::unique_ptr<HeadScorer> make_knorm(const Params&) {
  return std::make_unique<KnormScorer>();
}

}  // namespace

ScorerDescriptor knorm_scorer() {
  return {"knorm", {}, make_knorm};
}

PolicyDescriptor knorm_descriptor() {
  return {"knorm",
          "keep the keys of lowest L2 norm, per head, at every step",
          "Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression, "
          "EMNLP 2024",
          "docs/policies/knorm.md",
          {{"budget", ParamType::Int, "256", "entries kept per head"}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "knorm:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(
                make_knorm(p), std::vector<int64_t>{p.get_int("budget")}, true, "highest key norm");
          }};
}

}  // namespace kvscope::policy
