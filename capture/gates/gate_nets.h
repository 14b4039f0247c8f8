// The forward pass of the three seed gate networks, for one layer, written
// from the papers' equations (and the official code where the paper is
// silent). Shared by the policies (inference, no grad) and the trainer
// (autograd through the parameters and the inputs). Notation: n tokens, K kv
// heads, hd head dim, D hidden size.
#pragma once

#include <torch/types.h>

#include "capture/gates/gate_set.h"

namespace kvscope::gates {

// WG-KV write gate (seed 000 §3.2): for each kv head h and token t,
//   x = [RMSNorm_pre(k_t,h); RMSNorm_post(k^rope_t,h)]        (2 hd)
//   g = sigmoid(W2_h GELU(W1_h x + b1_h) + b2_h)
// clamped below at `epsilon` as the official GatingPredictor does (so
// log g stays finite). k_pre, k_post: [n, K, hd]. Returns g [K, n].
torch::Tensor wgkv_gate(const GateSet& g, int64_t layer, const torch::Tensor& k_pre,
                        const torch::Tensor& k_post);

// Attention-Gate scores (seed 001 §3.3, Eq. 3-4) before the gate:
//   s = MHA'(X) W_O'  with h' heads over all n tokens (no causal mask: the
//   gate sees the whole prompt), X = the layer's normalised input [n, D].
// Returns s [K, n]; the keep probability is sigmoid(s + gamma) and the flag
// is (probability > tau).
torch::Tensor attention_gate_scores(const GateSet& g, int64_t layer, const torch::Tensor& hidden);

// Retention gate, log beta [K, n] (log-sigmoid, as TrimKV computes it):
//   retention:         log beta = logsigmoid(W2 act(W1 x + b1) + b)           (per layer)
//   retention-global:  log beta_h = logsigmoid(w . act(W1_h x + b1_h) + b)   (w, b shared
//                      by every layer and head: seed 002 §4.1)
torch::Tensor retention_log_beta(const GateSet& g, int64_t layer, const torch::Tensor& hidden);

// DMS eviction-decision logits (Łańcucki et al. 2025; NVIDIA's adapter form,
// Model-Optimizer experimental/dms: a separate projection, the base frozen):
//   z = scale * W_l h - offset                                      [K, n]
// h = the layer's normalised input [n, D]. The decision is made one token
// late: z of token t decides whether token t - 1 is evicted once it leaves
// the window (dms_attn_train_mode shifts the logits by one), at inference by
// z > 0. W starts at zero, so every token starts kept (z = -offset).
torch::Tensor dms_decision_logits(const GateSet& g, int64_t layer, const torch::Tensor& hidden);

}  // namespace kvscope::gates
