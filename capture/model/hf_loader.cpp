#include "capture/model/hf_loader.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "capture/formats/safetensors.h"
#include "capture/model/hf_config.h"
#include "capture/model/mapped_tensor.h"
#include "capture/model/weight_builder.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace fs = std::filesystem;

namespace {

// An MoE layer's router and experts: Mixtral's block_sparse_moe.{gate,
// experts.E.w1/w3/w2}, Qwen3-MoE's and OLMoE's mlp.{gate, experts.E.gate_proj/
// up_proj/down_proj}. `stem` is "ffn_gate_inp" or "ffn_{gate,up,down}_exps.E";
// "" when it is neither.
std::string hf_moe_name(const std::string& stem, Architecture arch) {
  const bool mixtral = arch == Architecture::Mixtral;
  const std::string prefix = mixtral ? "block_sparse_moe." : "mlp.";
  if (stem == "ffn_gate_inp") return prefix + "gate";
  const size_t dot = stem.find('.');
  if (dot == std::string::npos) return "";
  static const std::map<std::string, std::pair<const char*, const char*>> experts = {
      {"ffn_gate_exps", {"gate_proj", "w1"}},
      {"ffn_up_exps", {"up_proj", "w3"}},
      {"ffn_down_exps", {"down_proj", "w2"}}};
  auto it = experts.find(stem.substr(0, dot));
  if (it == experts.end()) return "";
  return prefix + "experts." + stem.substr(dot + 1) + "." +
         (mixtral ? it->second.second : it->second.first);
}

}  // namespace

std::string hf_name(const std::string& canonical, Architecture arch) {
  static const std::map<std::string, std::string> llama = {
      {"token_embd", "embed_tokens"},      {"output_norm", "norm"},
      {"attn_norm", "input_layernorm"},    {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},       {"output", "lm_head"}};
  static const std::map<std::string, std::string> gpt2_names = {
      {"token_embd", "wte"},          {"position_embd", "wpe"}, {"output_norm", "ln_f"},
      {"attn_norm", "ln_1"},          {"ffn_norm", "ln_2"},     {"attn_qkv", "attn.c_attn"},
      {"attn_output", "attn.c_proj"}, {"ffn_up", "mlp.c_fc"},   {"ffn_down", "mlp.c_proj"},
      {"output", "lm_head"}};
  const bool gpt2 = arch == Architecture::Gpt2;
  const auto& table = gpt2 ? gpt2_names : llama;
  std::string layer, rest = canonical;
  if (rest.rfind("blk.", 0) == 0) {
    size_t dot = rest.find('.', 4);
    layer = rest.substr(4, dot - 4);
    rest = rest.substr(dot + 1);
  }
  size_t dot = rest.rfind('.');
  std::string stem = rest.substr(0, dot), suffix = rest.substr(dot);
  // Phi-3 keeps q/k/v and gate/up fused.
  static const std::map<std::string, std::string> phi3 = {{"attn_qkv", "self_attn.qkv_proj"},
                                                          {"ffn_up", "mlp.gate_up_proj"}};
  auto fused = phi3.find(stem);
  auto it = table.find(stem);
  std::string mapped = arch == Architecture::Phi3 && fused != phi3.end() ? fused->second
                       : it != table.end()                               ? it->second
                                                                         : hf_moe_name(stem, arch);
  if (mapped.empty()) mapped = stem;
  if (!layer.empty()) mapped = (gpt2 ? "h." : "layers.") + layer + "." + mapped;
  return mapped + suffix;
}

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path, "", std::string("invalid JSON: ") + e.what());
  }
}

class HfSource : public WeightSource {
 public:
  HfSource(const HfFiles& files, Architecture arch)
      : arch_(arch), gpt2_(arch == Architecture::Gpt2), file_(files.dir) {
    std::map<std::string, std::string> expected;  // from the index, name -> shard
    const fs::path index = fs::path(files.dir) / "model.safetensors.index.json";
    if (files.shards.size() > 1 || fs::exists(index)) read_index(index.string(), &expected);
    for (const std::string& shard : files.shards) {
      auto f = std::make_shared<formats::SafetensorsFile>(shard);
      for (const auto& [name, t] : f->tensors()) {
        if (!expected.empty()) {
          auto it = expected.find(name);
          if (it == expected.end() || fs::path(it->second).filename() != fs::path(shard).filename())
            throw InputError(shard, name,
                             "tensor is not listed for this shard in " + index.string());
        }
        if (!where_.emplace(name, f.get()).second)
          throw InputError(shard, name, "tensor appears in more than one shard");
      }
      files_.push_back(std::move(f));
    }
    for (const auto& [name, shard] : expected)
      if (!where_.count(name))
        throw InputError(index.string(), name, "listed in weight_map but absent from " + shard);
  }

  const std::string& file() const override { return file_; }
  bool has(const std::string& canonical) const override { return find(canonical) != nullptr; }
  std::string native_name(const std::string& canonical) const override {
    if (const formats::StTensor* t = find(canonical)) return t->name;
    return hf_name(canonical, arch_);
  }
  torch::Tensor get(const std::string& canonical) override {
    const formats::StTensor* t = find(canonical);
    if (!t) throw InputError(file_, hf_name(canonical, arch_), "tensor is missing");
    const formats::SafetensorsFile* f = where_.at(t->name);
    torch::ScalarType dtype;
    switch (t->dtype) {
      case formats::StDtype::F32: dtype = torch::kFloat32; break;
      case formats::StDtype::F16: dtype = torch::kFloat16; break;
      case formats::StDtype::BF16: dtype = torch::kBFloat16; break;
      default:
        throw InputError(
            f->path(), t->name,
            "dtype " + t->dtype_name + " is not supported for weights (expected F32, F16 or BF16)");
    }
    return mapped_tensor(f->mapping(), f->data(*t), t->shape, dtype);
  }
  bool conv1d_layout() const override { return gpt2_; }

 private:
  const formats::StTensor* find(const std::string& canonical) const {
    const std::string name = hf_name(canonical, arch_);
    const std::vector<std::string> candidates =
        canonical == "output.weight" ? std::vector<std::string>{name}
        : gpt2_                      ? std::vector<std::string>{name, "transformer." + name}
                                     : std::vector<std::string>{"model." + name, name};
    for (const std::string& c : candidates) {
      auto it = where_.find(c);
      if (it != where_.end()) return it->second->find(c);
    }
    return nullptr;
  }

  static void read_index(const std::string& path, std::map<std::string, std::string>* out) {
    nlohmann::json j = read_json(path);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw InputError(path, "weight_map", "must be an object mapping tensor names to shard files");
    for (auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) throw InputError(path, "weight_map." + name, "must be a file name");
      (*out)[name] = shard.get<std::string>();
    }
  }

  Architecture arch_;
  bool gpt2_;
  std::string file_;
  std::vector<std::shared_ptr<formats::SafetensorsFile>> files_;
  std::map<std::string, const formats::SafetensorsFile*> where_;
};

}  // namespace

HfFiles find_hf_files(const std::string& dir) {
  HfFiles f;
  f.dir = dir;
  f.config = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(f.config))
    throw InputError(dir, "config.json", "not found in the model directory");
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    nlohmann::json j = read_json(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw InputError(index.string(), "weight_map",
                       "must be an object mapping tensor names to shard files");
    std::set<std::string> shards;
    for (auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string())
        throw InputError(index.string(), "weight_map." + name, "must be a file name");
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        throw InputError(index.string(), "weight_map." + name,
                         "shard \"" + s + "\" must be a plain file name");
      shards.insert(s);
    }
    for (const std::string& s : shards) f.shards.push_back((fs::path(dir) / s).string());
  } else if (fs::is_regular_file(single)) {
    f.shards.push_back(single.string());
  } else {
    throw InputError(
        dir, "model.safetensors",
        "no model.safetensors or model.safetensors.index.json (PyTorch .bin checkpoints "
        "are not supported; save with safetensors)");
  }
  return f;
}

std::unique_ptr<Transformer> load_hf_model(const std::string& dir,
                                           const torch::TensorOptions& target) {
  HfFiles files = find_hf_files(dir);
  ModelConfig config = parse_hf_config(files.config);
  config.name = fs::path(dir).filename().string();
  if (config.name.empty()) config.name = fs::path(dir).parent_path().filename().string();
  HfSource source(files, config.arch);
  ModelWeights weights = build_weights(config, source, target);
  return std::make_unique<Transformer>(std::move(config), std::move(weights));
}

}  // namespace kvscope::model
