#include "capture/gates/sfc_forecaster.h"

#include <torch/torch.h>

#include <cmath>

#include "core/common/input_error.h"

namespace kvscope::gates {

SfcConfig SfcConfig::of(const GateSet& g) {
  if (g.kind != GateKind::SfcGru)
    throw InputError(g.source, "policy",
                     std::string("is ") + gate_kind_name(g.kind) + " (expected sfc-gru)");
  SfcConfig c;
  c.hidden = int64_t(g.hyper("hidden"));
  c.latent = int64_t(g.hyper("latent"));
  c.horizon = int64_t(g.hyper("horizon"));
  c.ewma = g.hyper("ewma");
  c.tau_quantile = g.hyper("tau_quantile");
  c.head_dim = g.shape.head_dim;
  if (c.hidden > kSfcMaxHidden)
    throw InputError(g.source, "hyperparameters.hidden",
                     "is " + std::to_string(c.hidden) + " (expected at most " +
                         std::to_string(kSfcMaxHidden) + " for sfc-gru)");
  return c;
}

void sfc_features(const SfcConfig& c, float ewma, int64_t tokens_before, int64_t distance,
                  float key_norm, const float* z_query, const float* z_key, float* x) {
  const float inv_sqrt_hd = 1.0f / std::sqrt(float(c.head_dim));
  float align = 0;
  for (int64_t i = 0; i < c.latent; ++i) align += z_query[i] * z_key[i];
  x[kSfcAttention] = std::log1p(ewma * float(tokens_before));
  x[kSfcDistance] = std::log1p(float(distance)) / 8.0f;
  x[kSfcKeyNorm] = key_norm * inv_sqrt_hd;
  x[kSfcAlign] = align * inv_sqrt_hd;
  for (int64_t i = 0; i < c.latent; ++i) x[kSfcLatent + i] = z_key[i];
}

namespace {

// The tensors of one kind for every layer, concatenated [L, K, ...] flat.
std::vector<float> per_layer(const GateSet& g, const char* name) {
  std::vector<float> out;
  for (int64_t l = 0; l < g.shape.n_layers; ++l) {
    torch::Tensor t =
        g.param("layers." + std::to_string(l) + ".sfc." + name).to(torch::kFloat32).contiguous();
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

std::vector<float> flat(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

SfcForecaster::SfcForecaster(const GateSet& g)
    : cfg_(SfcConfig::of(g)),
      L_(g.shape.n_layers),
      K_(g.shape.n_kv_heads),
      G_(cfg_.hidden),
      F_(cfg_.features()),
      Z_(cfg_.latent),
      hd_(g.shape.head_dim),
      latent_(per_layer(g, "latent")),
      w_ih_(per_layer(g, "w_ih")),
      w_hh_(per_layer(g, "w_hh")),
      b_ih_(per_layer(g, "b_ih")),
      b_hh_(per_layer(g, "b_hh")),
      head_w_(flat(g.param("sfc_shared.head.weight"))),
      head_b_(flat(g.param("sfc_shared.head.bias"))) {}

void SfcForecaster::latent(int64_t layer, int64_t kv_head, const float* v, float* z) const {
  const float* w = group(latent_, layer, kv_head, hd_ * Z_);
  for (int64_t j = 0; j < Z_; ++j) z[j] = 0;
  for (int64_t i = 0; i < hd_; ++i) {
    const float vi = v[i];
    const float* row = w + i * Z_;
    for (int64_t j = 0; j < Z_; ++j) z[j] += vi * row[j];
  }
}

// PyTorch's GRU cell (gate order r, z, n), written out.
void SfcForecaster::step(int64_t layer, int64_t kv_head, const float* x, float* h,
                         float* logits) const {
  const int64_t G = G_, F = F_;
  const float* wi = group(w_ih_, layer, kv_head, 3 * G * F);
  const float* wh = group(w_hh_, layer, kv_head, 3 * G * G);
  const float* bi = group(b_ih_, layer, kv_head, 3 * G);
  const float* bh = group(b_hh_, layer, kv_head, 3 * G);
  float gi[3 * kSfcMaxHidden], gh[3 * kSfcMaxHidden];  // G <= kSfcMaxHidden (SfcConfig::of)
  for (int64_t r = 0; r < 3 * G; ++r) {
    float a = bi[r], b = bh[r];
    for (int64_t c = 0; c < F; ++c) a += wi[r * F + c] * x[c];
    for (int64_t c = 0; c < G; ++c) b += wh[r * G + c] * h[c];
    gi[r] = a;
    gh[r] = b;
  }
  for (int64_t j = 0; j < G; ++j) {
    const float reset = sfc_sigmoid(gi[j] + gh[j]);
    const float update = sfc_sigmoid(gi[G + j] + gh[G + j]);
    const float cand = std::tanh(gi[2 * G + j] + reset * gh[2 * G + j]);
    h[j] = (1.0f - update) * cand + update * h[j];
  }
  for (int64_t o = 0; o < 2; ++o) {
    float s = head_b_[size_t(o)];
    for (int64_t j = 0; j < G; ++j) s += head_w_[size_t(o * G + j)] * h[j];
    logits[o] = s;
  }
}

// ---- the batched form ---------------------------------------------------------

SfcParams SfcParams::of(const GateSet& g) {
  std::vector<torch::Tensor> latent, w_ih, b_ih, w_hh, b_hh;
  for (int64_t l = 0; l < g.shape.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".sfc.";
    latent.push_back(g.param(p + "latent"));
    w_ih.push_back(g.param(p + "w_ih"));
    b_ih.push_back(g.param(p + "b_ih"));
    w_hh.push_back(g.param(p + "w_hh"));
    b_hh.push_back(g.param(p + "b_hh"));
  }
  return {torch::cat(latent),
          torch::cat(w_ih),
          torch::cat(b_ih),
          torch::cat(w_hh),
          torch::cat(b_hh),
          g.param("sfc_shared.head.weight"),
          g.param("sfc_shared.head.bias")};
}

SfcParams SfcParams::groups(const torch::Tensor& index) const {
  return {latent.index_select(0, index),
          w_ih.index_select(0, index),
          b_ih.index_select(0, index),
          w_hh.index_select(0, index),
          b_hh.index_select(0, index),
          head_w,
          head_b};
}

// ---- the GRU, written out --------------------------------------------------------

torch::Tensor sfc_input_gates(const torch::Tensor& x, const torch::Tensor& w_ih,
                              const torch::Tensor& b_ih) {
  return torch::bmm(x, w_ih.transpose(1, 2)) + b_ih.unsqueeze(1);  // W_i x + b_i
}

// r and u in one sigmoid over the first 2G gate rows; h' = (1 - u) n + u h
// as n + u (h - n) (the same value, one operation less per step).
torch::Tensor sfc_gru_update(const torch::Tensor& gi, const torch::Tensor& h,
                             const torch::Tensor& w_hh, const torch::Tensor& b_hh) {
  const int64_t G = h.size(-1);
  const torch::Tensor gh =
      torch::baddbmm(b_hh.unsqueeze(1), h, w_hh.transpose(1, 2));  // W_h h + b_h
  const torch::Tensor ru = torch::sigmoid(gi.narrow(-1, 0, 2 * G) + gh.narrow(-1, 0, 2 * G));
  const torch::Tensor r = ru.narrow(-1, 0, G), u = ru.narrow(-1, G, G);
  const torch::Tensor n = torch::tanh(gi.narrow(-1, 2 * G, G) + r * gh.narrow(-1, 2 * G, G));
  return n + u * (h - n);
}

torch::Tensor sfc_gru_step(const torch::Tensor& x, const torch::Tensor& h,
                           const torch::Tensor& w_ih, const torch::Tensor& w_hh,
                           const torch::Tensor& b_ih, const torch::Tensor& b_hh) {
  return sfc_gru_update(sfc_input_gates(x, w_ih, b_ih), h, w_hh, b_hh);
}

}  // namespace kvscope::gates
