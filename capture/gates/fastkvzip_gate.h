// The Fast KVzip gate (Kim, Han, Yun, "Fast KVzip: Efficient and Accurate LLM
// Inference with Gated KV Eviction", 2026; kvpress FastKVzipGate;
// docs/policies/fastkvzip.md): per layer, a low-rank "sink attention" from the
// token's normalised layer input h to a score in (0, 1) per kv head k,
//   q_g = RMSNorm(W_q h + b_q)[k, g],  c = RMSNorm(W_k h)[k]      (dim each)
//   z_g = c . q_g / sqrt(dim) + b[k, g]
//   s(k) = mean_g 1 / (1 + sum_s exp(B[k, s] . q_g / sqrt(dim) - z_g))
// i.e. the weight of the token's own key in a softmax against `base_keys`
// learned sink keys B, averaged over the group's query heads g. Shared by
// the trainer (fastkvzip_training.cpp) and the policy (policies/fastkvzip.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "capture/gates/gate_set.h"

namespace kvscope::gates {

struct FastKvzipLayer {
  torch::Tensor q_w, q_b, k_w;   // [K G dim, D], [K G dim], [K dim, D]
  torch::Tensor q_norm, k_norm;  // [dim] each
  torch::Tensor b;               // [K, 1, G]
  torch::Tensor k_base;          // [K, 1, base_keys, dim] (undefined when base_keys = 0)
};

// The tensors of layer l of a fastkvzip gate file: "layers.{l}.fastkvzip." +
// kvpress's state-dict names (q_proj.weight, q_proj.bias, k_proj.weight,
// q_norm.weight, k_norm.weight, b, k_base).
std::string fastkvzip_prefix(int64_t layer);
FastKvzipLayer fastkvzip_layer(const GateSet& g, int64_t layer);

// Scores [n, K] in (0, 1) of the rows of hidden [n, D] (differentiable).
torch::Tensor fastkvzip_forward(const FastKvzipLayer& p, const torch::Tensor& hidden, int64_t K,
                                int64_t G, int64_t dim);

}  // namespace kvscope::gates
