#include "capture/model/model_loader.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "capture/formats/gguf.h"
#include "capture/formats/safetensors.h"
#include "capture/model/gguf_loader.h"
#include "capture/model/hf_config.h"
#include "capture/model/hf_loader.h"
#include "capture/model/llama2c_loader.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

const char* model_format_name(ModelFormat f) {
  switch (f) {
    case ModelFormat::HfDirectory:
      return "Hugging Face safetensors";
    case ModelFormat::Gguf:
      return "GGUF";
    case ModelFormat::Llama2c:
      return "llama2.c";
  }
  return "?";
}

ModelFormat detect_model_format(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path, "", "model path does not exist");
  if (fs::is_directory(path, ec)) return ModelFormat::HfDirectory;
  const std::string name = fs::path(path).filename().string();
  if (name == "config.json" || ends_with(name, ".safetensors") ||
      ends_with(name, ".safetensors.index.json"))
    return ModelFormat::HfDirectory;
  if (starts_with_gguf_magic(path)) return ModelFormat::Gguf;
  if (ends_with(name, ".gguf")) return ModelFormat::Gguf;  // the reader reports what is wrong
  if (looks_like_llama2c(path)) return ModelFormat::Llama2c;
  throw InputError(path, "",
                   "not a model KVScope can read: expected a Hugging Face directory (config.json + "
                   "safetensors), a .gguf file or a llama2.c .bin checkpoint");
}

std::string model_root(const std::string& path, ModelFormat format) {
  if (format == ModelFormat::HfDirectory && !fs::is_directory(path))
    return fs::path(path).parent_path().string();
  return path;
}

std::unique_ptr<Transformer> load_model(const std::string& path,
                                        const torch::TensorOptions& target) {
  const ModelFormat format = detect_model_format(path);
  switch (format) {
    case ModelFormat::HfDirectory:
      return load_hf_model(model_root(path, format), target);
    case ModelFormat::Gguf:
      return load_gguf_model(path, target);
    case ModelFormat::Llama2c:
      return load_llama2c_model(path, target);
  }
  return nullptr;
}

namespace {

void inspect_hf(ModelFileInfo* info) {
  HfFiles files = find_hf_files(info->path);
  info->config = parse_hf_config(files.config);
  info->config.name = fs::path(info->path).filename().string();
  for (const std::string& shard : files.shards) {
    formats::SafetensorsFile f(shard);
    info->file_bytes += static_cast<int64_t>(fs::file_size(shard));
    for (const auto& [name, t] : f.tensors()) {
      // GPT-2 checkpoints may carry causal-mask buffers; they are not weights.
      if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
      ++info->tensor_count;
      info->parameter_count += t.elements();
      ++info->storage_types[t.dtype_name];
    }
  }
  const fs::path dir(info->path);
  if (fs::is_regular_file(dir / "tokenizer.json")) info->embedded_tokenizer = "tokenizer.json";
  std::ifstream tc(dir / "tokenizer_config.json");
  if (tc) {
    std::stringstream ss;
    ss << tc.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      info->chat_template = j["chat_template"].get<std::string>();
  }
}

void inspect_gguf(ModelFileInfo* info) {
  formats::GgufFile g(info->path);
  info->config = gguf_model_config(g);
  info->file_bytes = static_cast<int64_t>(fs::file_size(info->path));
  for (const formats::GgufTensor& t : g.tensors()) {
    ++info->tensor_count;
    info->parameter_count += t.elements();
    ++info->storage_types[formats::ggml_type_name(t.type)];
  }
  info->embedded_tokenizer = g.get_string_or("tokenizer.ggml.model", "");
  info->chat_template = g.get_string_or("tokenizer.chat_template", "");
}

void inspect_llama2c(ModelFileInfo* info) {
  info->config = llama2c_model_config(info->path);
  info->file_bytes = static_cast<int64_t>(fs::file_size(info->path));
  const ModelConfig& c = info->config;
  const int64_t D = c.hidden_size, F = c.intermediate_size, L = c.n_layers;
  info->tensor_count = 3 + 9 * L + (c.tied_embeddings ? 0 : 1);
  info->parameter_count = c.vocab_size * D * (c.tied_embeddings ? 1 : 2) + D +
                          L * (2 * D + 2 * D * D + 2 * c.kv_dim() * D + 3 * F * D);
  info->storage_types["F32"] = info->tensor_count;
}

}  // namespace

ModelFileInfo inspect_model(const std::string& path) {
  ModelFileInfo info;
  info.format = detect_model_format(path);
  info.path = model_root(path, info.format);
  switch (info.format) {
    case ModelFormat::HfDirectory:
      inspect_hf(&info);
      break;
    case ModelFormat::Gguf:
      inspect_gguf(&info);
      break;
    case ModelFormat::Llama2c:
      inspect_llama2c(&info);
      break;
  }
  return info;
}

}  // namespace kvscope::model
