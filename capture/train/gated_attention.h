// Differentiable dense attention over a whole sequence with a learned gate
// written into it the way each paper trains it, behind the model's
// AttentionBackend seam (the trainer runs Transformer::forward_hidden over
// it). One forward step = the whole training window at position 0.
//   wgkv:              softmax(qk/sqrt(d) + log g~) with g~_ij = 1 if i-j < W
//                      else g_j (seed 000 §3.2, the log-space form)
//   attention-gate:    keys masked column-wise by the keep flags, the
//                      diagonal always kept (seed 001 Eq. 5); flags are hard in
//                      the forward pass with a straight-through gradient
//   retention(-global): softmax(qk/sqrt(d) + (i-j) log beta_j) (TrimKV,
//                      seed 002 Eq. in §2.2)
//   dms:               softmax(qk/sqrt(d) + [i - j > w] log(1 - alpha_j)) with
//                      alpha_j = sigmoid((z_{j+1} + logistic noise) / tau),
//                      the Gumbel-sigmoid of the next token's decision
//                      logit (DMS, NVIDIA's dms_attn_train_mode)
// Mode::Hard replaces the soft gate by the inference-time decision, so the
// loss it gives is the one the ragged cache will see (wgkv: vertical-slash
// mask with g >= tau; attention-gate: the same hard flags; dms: keys with
// z_{j+1} > 0 hidden from queries past j + w).
#pragma once

#include <torch/types.h>

#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/model/attention_backend.h"

namespace kvscope::gates {

// out[i, h] = sum_j p_hij v_j with p_hi = softmax over causal j of
// q_i.k_j * scale + bias_kij, multiplied by mult_kij and renormalised when
// mult is given (k = the kv head of query head h). bias, mult: [K, n, n] or
// undefined. q [n, H, hd], k/v [n, K, hd]; window > 0: the model's sliding
// window. Differentiable in every input.
torch::Tensor dense_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double scale, int64_t window,
                              const torch::Tensor& bias, const torch::Tensor& mult);

// Straight-through keep flags of Attention-Gate: forward (sigmoid(s + gamma)
// > tau) as 0/1, backward d/ds sigmoid(s + gamma) (seed 001 §3.5).
torch::Tensor straight_through_flags(const torch::Tensor& s, double gamma, double tau);

// The WG-KV log-gate bias [K, n, n]: 0 where i - j < W, log g_j elsewhere.
torch::Tensor wgkv_log_bias(const torch::Tensor& g, int64_t window);
// The retention bias [K, n, n]: (i - j) log beta_j for j <= i (0 above the
// diagonal, which the causal mask removes anyway).
torch::Tensor retention_bias(const torch::Tensor& log_beta);
// Attention-Gate column mask [K, n, n]: flags_j off the diagonal, 1 on it.
torch::Tensor attention_gate_mask(const torch::Tensor& flags);
// DMS: the decision about key j is the next token's logit: [K, n] -> [K, n]
// with column j = z[:, j + 1] and the last column 0 (no next token yet).
torch::Tensor dms_shift(const torch::Tensor& z);
// The DMS bias [K, n, n]: 0 where i - j <= window, log_keep_j beyond.
torch::Tensor dms_log_bias(const torch::Tensor& log_keep, int64_t window);

class GatedDenseBackend : public model::AttentionBackend {
 public:
  enum class Mode { Full, Soft, Hard };
  // gates may be null with Mode::Full (the teacher: plain causal attention).
  GatedDenseBackend(const GateSet* gates, Mode mode) : gates_(gates), mode_(mode) {}
  // dms, Mode::Soft: the seed of the step's logistic (Gumbel-difference) noise.
  uint64_t noise_seed = 0;

  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;

  // Per layer, from the last step (autograd-connected in Soft mode):
  //   wgkv: g [K, n]; attention-gate: keep probability sigmoid(s + gamma)
  //   [K, n] and flags (straight-through) [K, n]; retention: log beta [K, n]
  //   and the soft cache size S_t = sum_{i<=t} beta_i^(t-i) [K, n]; dms:
  //   alpha (Soft: noisy, Hard: sigmoid(z)) and the eviction decisions
  //   [K, n] (Soft: straight-through 0/1, Hard: z > 0), unshifted.
  std::vector<torch::Tensor> gate;
  std::vector<torch::Tensor> flags;
  std::vector<torch::Tensor> soft_size;

 private:
  const GateSet* gates_;
  Mode mode_;
};

}  // namespace kvscope::gates
