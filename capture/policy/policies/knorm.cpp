// knorm: key-norm eviction (Devoto et al., "A Simple and Effective L2
// Norm-Based Strategy for KV Cache Compression", EMNLP 2024). Keys with a low
// L2 norm draw high attention, so each head keeps the `budget` keys of lowest
// norm: score = -||k||_2. RoPE rotates pairs of channels, so the norm of the
// cached (rotated) key is the norm before RoPE, but only up to rounding: the
// norm is taken before RoPE, where the keys of one token repeated at several
// positions (layer 0) are equal bit for bit and tie exactly (the older one
// leaves), instead of being ordered by RoPE's rounding, which differs between
// CPUs. Needs no attention at all.
// docs/policies/knorm.md
#include <cmath>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class KnormScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::key_pre_rope);
  }
  void setup(const PolicySetup& s) override {
    norms_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
  }
  std::string score_name() const override { return "knorm_negative_key_norm"; }
  std::string score_meaning() const override {
    return "-||k||_2 of the key before RoPE (= the cached key's norm; higher = kept)";
  }
  // Every forward pass: keeping the lowest norms chunk by chunk keeps the
  // lowest norms of the whole prompt.
  bool compresses(const LayerContext&) const override { return true; }

  void observe(LayerContext& c) override {
    torch::Tensor k = c.in.k_pre_rope.to(torch::kFloat32).contiguous();  // [n, K, hd]
    const float* kp = k.data_ptr<float>();
    const int64_t K = c.cache.n_kv_heads(), hd = c.cache.head_dim();
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < K; ++h) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d)
          s += double(kp[(i * K + h) * hd + d]) * kp[(i * K + h) * hd + d];
        norms_.at(c.layer, h)[c.pos0 + i] = float(-std::sqrt(s));
      }
  }
  Subsets subsets() const override { return Subsets::Entry; }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* n = norms_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) out[pos] = n[pos];
  }

 private:
  HeadScores norms_;
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
