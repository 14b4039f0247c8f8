// One entry point for every weight format: a Hugging Face directory (or its
// config.json), a .gguf file, or a llama2.c .bin checkpoint. The format is
// detected from the path and the file's first bytes.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <torch/types.h>

#include "capture/model/model_config.h"
#include "capture/model/transformer.h"

namespace kvscope::model {

enum class ModelFormat { HfDirectory, Gguf, Llama2c };
const char* model_format_name(ModelFormat f);

// Throws InputError when the path is none of the supported formats.
ModelFormat detect_model_format(const std::string& path);
// A directory for HF models (config.json or a file inside it -> its dir).
std::string model_root(const std::string& path, ModelFormat format);

std::unique_ptr<Transformer> load_model(const std::string& path,
                                        const torch::TensorOptions& target);

// What model-info prints: the config plus facts about the stored tensors,
// read without building the model.
struct ModelFileInfo {
  ModelFormat format = ModelFormat::HfDirectory;
  std::string path;
  ModelConfig config;
  int64_t file_bytes = 0;
  int64_t tensor_count = 0;
  int64_t parameter_count = 0;                   // elements of the stored tensors used
  std::map<std::string, int64_t> storage_types;  // dtype/quant name -> tensor count
  std::string embedded_tokenizer;                // e.g. "gpt2" (GGUF) or "tokenizer.json"
  std::string chat_template;                     // as found, may be empty
};
ModelFileInfo inspect_model(const std::string& path);

}  // namespace kvscope::model
