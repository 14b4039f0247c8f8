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

std::unique_ptr<Transformer> load_hf_model(const std::string& dir,
                                           const torch::TensorOptions& target);

}  // namespace kvscope::model
