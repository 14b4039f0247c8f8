// The Latent Salience Forecaster of the Salience Forecasting Cache (seed 004;
// docs/policies/sfc.md, "The Latent Salience Forecaster"): one single-layer
// GRU per GQA group (layer, kv head) over per-token features, and a
// projection head shared by every group with two outputs:
//   now      P(the token's attention at this step is above tau)
//   horizon  P(its attention is above tau at some step in t .. t+H-1)
// This is the capture-time form, plain loops over one token at a time (the
// forecaster runs every step for every held token: O(G (F + G)) per token);
// training uses the batched LibTorch form (capture/train/sfc_training.h, on SfcParams and
// sfc_gru_step below), and a test holds
// the two equal.
#pragma once

#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "capture/gates/gate_set.h"

namespace kvscope::gates {

inline constexpr int64_t kSfcMaxHidden = 64;

struct SfcConfig {
  int64_t hidden = 8;    // G
  int64_t latent = 8;    // Z
  int64_t horizon = 32;  // H, steps
  double ewma = 0.8;     // beta of the received-attention EWMA
  double tau_quantile = 0.9;
  int64_t head_dim = 0;
  int64_t features() const { return 4 + latent; }
  static SfcConfig of(const GateSet& g);  // throws InputError naming the file
};

// Feature indices (docs/policies/sfc.md): x0 log1p(a T), x1 log1p(d) / 8,
// x2 |k| / sqrt(hd), x3 (z_q . z_k) / sqrt(hd), x4.. z_k.
inline constexpr int64_t kSfcAttention = 0, kSfcDistance = 1, kSfcKeyNorm = 2, kSfcAlign = 3,
                         kSfcLatent = 4;

// Writes the F features of one token. `ewma`: the token's received-attention
// EWMA; `tokens_before`: tokens fed before the step; `distance`: first
// position of the step minus the token's; `key_norm`: |k|; `z_query`,
// `z_key`: the latents of the step's mean query and of the key.
void sfc_features(const SfcConfig& c, float ewma, int64_t tokens_before, int64_t distance,
                  float key_norm, const float* z_query, const float* z_key, float* x);

class SfcForecaster {
 public:
  explicit SfcForecaster(const GateSet& gates);

  const SfcConfig& config() const { return cfg_; }
  int64_t n_layers() const { return L_; }
  int64_t n_kv_heads() const { return K_; }

  // z = v W_lat of group (layer, kv_head): v is a key or a mean query [hd].
  void latent(int64_t layer, int64_t kv_head, const float* v, float* z) const;
  // One GRU step of group (layer, kv_head): h [G] is updated in place from
  // the features x [F]; `logits` receives (now, horizon).
  void step(int64_t layer, int64_t kv_head, const float* x, float* h, float* logits) const;

 private:
  const float* group(const std::vector<float>& w, int64_t layer, int64_t kv_head,
                     int64_t stride) const {
    return w.data() + (layer * K_ + kv_head) * stride;
  }

  SfcConfig cfg_;
  int64_t L_ = 0, K_ = 0, G_ = 0, F_ = 0, Z_ = 0, hd_ = 0;
  // Per group, row-major as in the gate file: latent [hd, Z], w_ih [3G, F],
  // w_hh [3G, G], b_ih [3G], b_hh [3G]; the shared head [2, G] and bias [2].
  std::vector<float> latent_, w_ih_, w_hh_, b_ih_, b_hh_, head_w_, head_b_;
};

inline float sfc_sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// ---- the batched (LibTorch) form: the policy's per-layer steps and training

// The parameters of every group stacked [NG = L * K, ...], autograd-connected
// to the gate set's tensors.
struct SfcParams {
  torch::Tensor latent;          // [NG, hd, Z]
  torch::Tensor w_ih, b_ih;      // [NG, 3G, F], [NG, 3G]
  torch::Tensor w_hh, b_hh;      // [NG, 3G, G], [NG, 3G]
  torch::Tensor head_w, head_b;  // [2, G], [2]
  static SfcParams of(const GateSet& g);
  SfcParams groups(const torch::Tensor& index) const;  // the rows of these groups
};

// The GRU cell of docs/policies/sfc.md (torch.nn.GRU's, gates r, z, n),
// batched over groups: x [B, N, F], h [B, N, G], weights per group
// [B, 3G, F] / [B, 3G, G] / [B, 3G] -> h' [B, N, G].
torch::Tensor sfc_input_gates(const torch::Tensor& x, const torch::Tensor& w_ih,
                              const torch::Tensor& b_ih);  // [B, N, 3G]
torch::Tensor sfc_gru_update(const torch::Tensor& gi, const torch::Tensor& h,
                             const torch::Tensor& w_hh, const torch::Tensor& b_hh);
torch::Tensor sfc_gru_step(const torch::Tensor& x, const torch::Tensor& h,
                           const torch::Tensor& w_ih, const torch::Tensor& w_hh,
                           const torch::Tensor& b_ih, const torch::Tensor& b_hh);

}  // namespace kvscope::gates
