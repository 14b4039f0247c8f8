// Assembles ModelWeights from a WeightSource: every tensor's shape is checked
// against the config (the message names the tensor, the shape found and the
// config fields that imply the expected one), q/k rows are brought into
// rotate-half order, Conv1D weights transposed, q/k/v and gate/up fused, and
// everything converted to the requested dtype and device.
#pragma once

#include <torch/types.h>

#include "capture/model/model_config.h"
#include "capture/model/model_weights.h"
#include "capture/model/weight_source.h"

namespace kvscope::model {

ModelWeights build_weights(const ModelConfig& config, WeightSource& source,
                           const torch::TensorOptions& target);

// Meta/interleaved -> HF rotate-half row order within each head, for a q or
// k weight [n_heads * head_dim, in] or bias [n_heads * head_dim]
// (formats.md §2.5: HF row j*d/2 + i = Meta row 2i + j).
torch::Tensor interleaved_to_rotate_half(const torch::Tensor& w, int64_t n_heads, int64_t head_dim);

}  // namespace kvscope::model
