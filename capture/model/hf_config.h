// Hugging Face config.json -> ModelConfig for llama (Llama 2/3.x, SmolLM,
// TinyLlama), mistral, qwen2, qwen3 and gpt2, with the defaults of the
// transformers config classes when a field is absent (formats.md §2).
#pragma once

#include <string>

#include "capture/model/model_config.h"

namespace kvscope::model {

// Throws InputError naming config.json and the field for anything missing,
// mistyped or unsupported (unknown model_type, unsupported RoPE scaling, ...).
ModelConfig parse_hf_config(const std::string& config_json_path);

}  // namespace kvscope::model
