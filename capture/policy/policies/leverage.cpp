// leverage: approximate statistical leverage of the pre-RoPE keys (Chari &
// Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
// Approximate Leverage Scores", 2025; kvpress LeverageScorePress). Keys that
// are outliers in the geometry of the head's key set (high leverage) are
// hard to reconstruct from the others and stay. With X = (K - mean K) Phi the
// right-sketched, sequence-centred pre-RoPE keys (Phi [d, k] Gaussian / sqrt(k)):
//   score(j) = x_j^T (X^T X + jitter I)^-1 x_j,
// z-scored over the layer's heads. The sketch is drawn per layer from a CPU
// generator seeded with `seed` (kvpress: the global torch generator in the
// same order, so `torch.manual_seed(seed)` before kvpress's prefill draws the
// same Phi). Query-agnostic, so at decode (decode=true) the scores are
// re-derived over the held keys with a fresh sketch. docs/policies/leverage.md
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/compactor_scores.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

torch::Tensor leverage_scores(const torch::Tensor& keys_pre_rope, int64_t sketch,
                              at::Generator& gen) {
  const int64_t K = keys_pre_rope.size(0), d = keys_pre_rope.size(2);
  torch::Tensor phi =
      torch::randn({1, K, d, sketch}, gen, torch::kFloat32).squeeze(0) * (1.0 / std::sqrt(double(sketch)));
  torch::Tensor x = (keys_pre_rope - keys_pre_rope.mean(-2, true)).matmul(phi);  // [K, S, k]
  torch::Tensor xt = x.transpose(-2, -1);
  torch::Tensor g = xt.matmul(x);
  g = 0.5 * (g + g.transpose(-2, -1));
  torch::Tensor eye = torch::eye(sketch, g.options());
  torch::Tensor l;
  double jitter = 1e-2;
  for (int attempt = 0;; ++attempt) {
    auto [factor, info] = torch::linalg_cholesky_ex(g + jitter * eye, false, false);
    if (info.eq(0).all().item<bool>()) {
      l = factor;
      break;
    }
    if (attempt == 4) throw std::runtime_error("leverage: Cholesky failed after 5 tries");
    jitter *= 10.0;
  }
  torch::Tensor inv_xt = torch::cholesky_solve(xt, l, false);  // [K, k, S]
  return (x * inv_xt.transpose(-2, -1)).sum(-1).clamp_min(0);  // [K, S]
}

namespace {

class LeverageScorer : public HeadScorer {
 public:
  LeverageScorer(int64_t sketch, uint64_t seed)
      : sketch_(sketch), gen_(at::detail::createCPUGenerator(seed)) {}
  void setup(const PolicySetup& s) override {
    inverse_ = std::make_unique<RopeInverse>(*s.model);
    K_ = s.model->n_kv_heads;
  }
  std::string score_name() const override { return "leverage"; }
  std::string score_meaning() const override {
    return "approximate leverage of the pre-RoPE key in the head's sketched key set, z-scored "
           "over the layer";
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    if (c.layer != layer_ || c.step != step_) score_layer(c);
    const torch::Tensor& s = z_[size_t(kv_head)];
    const std::vector<int32_t>& pos = pos_[size_t(kv_head)];
    const float* p = s.data_ptr<float>();
    for (size_t j = 0; j < pos.size(); ++j) out[pos[j]] = p[j];
  }

 private:
  // Every head of the layer at once: one sketch per layer (kvpress's [B, K,
  // d, k] draw) and one z-score over all heads.
  void score_layer(LayerContext& c) {
    layer_ = c.layer, step_ = c.step;
    std::vector<torch::Tensor> keys;
    pos_.assign(size_t(K_), {});
    for (int64_t h = 0; h < K_; ++h) {
      HeldRows r = held_rows(c.cache, c.layer, h);
      keys.push_back((*inverse_)(r.keys, r.pos, c.tokens_fed()));
      pos_[size_t(h)] = std::move(r.pos);
    }
    std::vector<torch::Tensor> raw;
    if (same_length(keys)) {
      torch::Tensor all = leverage_scores(torch::stack(keys), sketch_, gen_);
      for (int64_t h = 0; h < K_; ++h) raw.push_back(all[h]);
    } else {  // heads hold different numbers of entries (after decode evictions)
      for (const torch::Tensor& k : keys) raw.push_back(leverage_scores(k.unsqueeze(0), sketch_, gen_)[0]);
    }
    torch::Tensor cat = torch::cat(raw);
    const torch::Tensor mean = cat.mean(), stdev = cat.std().clamp_min(1e-6);
    z_.clear();
    for (const torch::Tensor& r : raw) z_.push_back(((r - mean) / stdev).contiguous());
  }
  static bool same_length(const std::vector<torch::Tensor>& t) {
    for (const torch::Tensor& x : t)
      if (x.size(0) != t[0].size(0)) return false;
    return true;
  }

  int64_t sketch_;
  at::Generator gen_;
  std::unique_ptr<RopeInverse> inverse_;
  int64_t K_ = 0, layer_ = -1, step_ = -1;
  std::vector<std::vector<int32_t>> pos_;
  std::vector<torch::Tensor> z_;
};

std::vector<ParamSpec> leverage_params() {
  return {{"sketch", ParamType::Int, "48", "columns of the Gaussian sketch", 1},
          {"seed", ParamType::Int, "0", "seed of the sketch's generator", 0}};
}

std::unique_ptr<HeadScorer> make_leverage(const Params& p) {
  return std::make_unique<LeverageScorer>(p.get_int("sketch"), uint64_t(p.get_int("seed")));
}

}  // namespace

ScorerDescriptor leverage_scorer() {
  return {"leverage", leverage_params(), make_leverage};
}

PolicyDescriptor leverage_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head"},
      {"decode", ParamType::Bool, "false",
       "also compress at every decode step, re-deriving the scores (false: prefill only, as "
       "kvpress)"}};
  for (const ParamSpec& s : leverage_params()) params.push_back(s);
  return {"leverage",
          "approximate statistical leverage of the pre-RoPE keys (query-agnostic outliers stay)",
          "Chari & Van Durme, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
          "Approximate Leverage Scores, 2025 (kvpress LeverageScorePress)",
          "docs/policies/leverage.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "leverage:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_leverage(p),
                                                  std::vector<int64_t>{p.get_int("budget")},
                                                  p.get_bool("decode"), "lowest key leverage");
          }};
}

}  // namespace kvscope::policy
