// The two query-agnostic / chunked scores Compactor blends (Chari & Van
// Durme, 2025), each a policy of its own too: approximate leverage of the
// pre-RoPE keys (leverage.cpp) and non-causal chunked attention
// (non_causal_attention.cpp). Tensor in, tensor out, no cache: compactor.cpp
// calls both on the middle of the prompt.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>

namespace kvscope::policy {

// Leverage scores diag(X (X^T X)^-1 X^T) of the sequence-centred keys
// sketched by Phi ~ N(0, 1/k) [K, d, k] (drawn from `gen`), via a Cholesky
// factor of X^T X + jitter I (jitter 1e-2, x10 until it factors), clamped at
// 0. keys_pre_rope [K, S, d] -> [K, S] float32.
torch::Tensor leverage_scores(const torch::Tensor& keys_pre_rope, int64_t sketch,
                              at::Generator& gen);

// Column sums of non-causal attention within chunks of `chunk` positions
// (no 1/sqrt(d): kvpress's definition), mean over the group's query heads,
// times ||v||, pooled over 3 neighbours (zero padding counted). queries [H,
// S, d] and keys, values [K, S, d] after RoPE -> [K, S] float32.
torch::Tensor non_causal_scores(const torch::Tensor& queries, const torch::Tensor& keys,
                                const torch::Tensor& values, int64_t chunk);

}  // namespace kvscope::policy
