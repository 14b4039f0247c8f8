// Hugging Face model directories: config.json plus model.safetensors or
// shards listed in model.safetensors.index.json (formats.md §1, §2).
#pragma once

#include <memory>
#include <string>

#include <torch/types.h>

#include "capture/model/model_config.h"
#include "capture/model/transformer.h"

namespace kvscope::model {

// What a directory holds, without building the model (for model-info).
struct HfFiles {
  std::string dir;
  std::string config;               // path of config.json
  std::vector<std::string> shards;  // safetensors files
};
HfFiles find_hf_files(const std::string& dir);  // throws InputError

// The HF name of a canonical (GGUF-style) tensor name, without the optional
// "model." / "transformer." prefix: blk.3.attn_q.weight ->
// layers.3.self_attn.q_proj.weight (GPT-2: h.3.attn.c_attn.weight for attn_qkv;
// an expert, blk.3.ffn_up_exps.5.weight -> layers.3.mlp.experts.5.up_proj.weight,
// Mixtral's layers.3.block_sparse_moe.experts.5.w3.weight).
std::string hf_name(const std::string& canonical, Architecture arch);

std::unique_ptr<Transformer> load_hf_model(const std::string& dir,
                                           const torch::TensorOptions& target);

}  // namespace kvscope::model
