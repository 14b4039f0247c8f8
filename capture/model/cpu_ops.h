// Fused float32 CPU loops for the small per-token operations of the forward
// pass (RMSNorm, RoPE, SwiGLU). Each replaces 4-16 LibTorch ops, whose
// dispatch and allocation cost dominates when a decode step works on one
// token. The forward uses them only when autograd is off and the tensors are
// contiguous float32 on the CPU; otherwise it runs the equivalent LibTorch
// ops, which the gate trainer differentiates through.
#pragma once

#include <torch/types.h>

namespace kvscope::model::cpu_ops {

// True when the fused loops may run on t (CPU, float32, no autograd).
bool eligible(const torch::Tensor& t);

// y = w * x / sqrt(mean(x^2) + eps) over the last dim of contiguous x.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);

// Rotate-half RoPE in place on rows of `heads` vectors of width hd, laid out
// as x[i * row_stride + h * hd + j]; cos/sin are [n, hd] contiguous (the two
// halves repeated, as transformers builds them).
void rope_inplace(float* x, int64_t n, int64_t row_stride, int64_t heads, int64_t hd,
                  const float* cos, const float* sin);

// silu(gate) * up for gu = [n, 2I] (gate columns then up columns) -> [n, I].
torch::Tensor swiglu(const torch::Tensor& gu, int64_t intermediate);

}  // namespace kvscope::model::cpu_ops
