// GGUF models (formats.md §3): llama (also Mistral and SmolLM, which use the
// llama architecture), qwen2, qwen3 and gpt2 metadata; F32, F16, BF16, Q8_0,
// Q4_0 and Q4_1 tensors dequantised at load; llama q/k rows brought from
// interleaved into rotate-half order; rope_freqs honoured.
#pragma once

#include <memory>
#include <string>

#include <torch/types.h>

#include "capture/formats/gguf.h"
#include "capture/model/model_config.h"
#include "capture/model/transformer.h"

namespace kvscope::model {

// The config the metadata describes (reads rope_freqs.weight if present).
ModelConfig gguf_model_config(const formats::GgufFile& gguf);

std::unique_ptr<Transformer> load_gguf_model(const std::string& path,
                                             const torch::TensorOptions& target);

}  // namespace kvscope::model
