#include "capture/gates/official_checkpoints.h"

#include <filesystem>
#include <fstream>

#include "capture/gates/torch_pickle.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string strip_model_prefix(const std::string& name) {
  return name.rfind("model.", 0) == 0 ? name.substr(6) : name;
}

GateSet from_wgkv(const std::string& path, std::vector<std::pair<std::string, torch::Tensor>> tensors,
                  const GateShape& shape) {
  GateSet set;
  set.kind = GateKind::WriteGate;
  set.shape = shape;
  set.source = path;
  json hyper = default_hyperparameters(GateKind::WriteGate, shape);
  for (auto& [name, t] : tensors) {
    const std::string n = strip_model_prefix(name);
    if (n.find(".g_predictors.") == std::string::npos)
      throw InputError(path, name, "not a WG-KV g_predictors parameter");
    if (n.find("value_norm") != std::string::npos)
      throw InputError(path, name,
                       "this checkpoint uses the value as a gate input (g_inputs with 'v'); "
                       "only the paper's [pre-RoPE key; post-RoPE key] gates are supported");
    set.params[n] = t;
  }
  // The MLP width is in the shapes: conv1 [K * expand * hd, 2 * hd, 1],
  // conv2 [K, expand * hd, 1].
  auto c1 = set.params.find("layers.0.self_attn.g_predictors.conv1.weight");
  auto c2 = set.params.find("layers.0.self_attn.g_predictors.conv2.weight");
  if (c1 == set.params.end() || c2 == set.params.end())
    throw InputError(path, "model.layers.0.self_attn.g_predictors.conv1/conv2.weight", "missing");
  const auto& d1 = c1->second.sizes();
  const auto& d2 = c2->second.sizes();
  if (d1.size() == 3 && d2.size() == 3 && d1[1] > 0 && d1[1] % 2 == 0)
    hyper["expand"] = double(d2[1]) / double(d1[1] / 2);
  if (set.params.find("layers.0.self_attn.g_predictors.pre_key_norm.weight") == set.params.end())
    throw InputError(path, "pre_key_norm.weight",
                     "missing: only gates with RMSNorm on [pre-RoPE key; post-RoPE key] (g_rms=1, "
                     "the paper's §3.2 inputs) are supported");
  set.meta = {{"format", "kvscope-gates"},
              {"version", 1},
              {"policy", "wgkv"},
              {"hyperparameters", hyper},
              {"training", {{"source", "official WG-KV checkpoint (EMCLab-Sinica/WG-KV)"},
                            {"file", path},
                            {"sha256", file_sha256(path)}}}};
  return set;
}

GateSet from_trimkv(const std::string& pth, const std::string& config_path,
                    std::vector<std::pair<std::string, torch::Tensor>> tensors, const GateShape& shape) {
  GateSet set;
  set.kind = GateKind::Retention;
  set.shape = shape;
  set.source = pth;
  json hyper = default_hyperparameters(GateKind::Retention, shape);
  json training = {{"source", "official TrimKV checkpoint (ngocbh/trimkv)"},
                   {"file", pth},
                   {"sha256", file_sha256(pth)}};
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    json c;
    try {
      c = json::parse(in);
    } catch (const std::exception& e) {
      throw InputError(config_path, "", std::string("invalid JSON: ") + e.what());
    }
    const std::string gate = c.value("retention_gate", "rg");
    if (gate != "rg")
      throw InputError(config_path, "retention_gate",
                       "'" + gate + "': only the hidden-state gate 'rg' (TrimKV's default) is supported");
    if (c.contains("hidden_act")) {
      const std::string act = c["hidden_act"];
      if (act != "silu" && act != "gelu")
        throw InputError(config_path, "hidden_act", "'" + act + "': silu or gelu expected");
      hyper["activation"] = act;
    }
    for (const char* k : {"memory_size", "buffer_size", "retention_gate_bias_init", "base_model"})
      if (c.contains(k)) training[k] = c[k];
    training["config"] = config_path;
  }
  for (auto& [name, t] : tensors) {
    const std::string n = strip_model_prefix(name);
    if (n.find(".retention_gate.") == std::string::npos)
      throw InputError(pth, name, "not a TrimKV retention_gate parameter");
    set.params[n] = t;
  }
  auto l1 = set.params.find("layers.0.self_attn.retention_gate.linear1.weight");
  if (l1 == set.params.end())
    throw InputError(pth, "model.layers.0.self_attn.retention_gate.linear1.weight", "missing");
  hyper["hidden"] = l1->second.size(0);
  set.meta = {{"format", "kvscope-gates"},
              {"version", 1},
              {"policy", "retention"},
              {"hyperparameters", hyper},
              {"training", training}};
  return set;
}

}  // namespace

GateSet load_official_checkpoint(const std::string& path, const GateShape& shape) {
  std::string pth = path, config;
  if (fs::is_directory(path)) {
    pth = (fs::path(path) / "trimkv_weights.pth").string();
    if (!fs::exists(pth))
      throw InputError(path, "trimkv_weights.pth",
                       "missing: a gate directory must be a TrimKV checkpoint directory");
  }
  const fs::path cfg = fs::path(pth).parent_path() / "config.json";
  if (fs::exists(cfg)) config = cfg.string();
  auto tensors = read_torch_save(pth);
  if (tensors.empty()) throw InputError(pth, "", "the checkpoint holds no tensors");
  const std::string& first = tensors.front().first;
  if (first.find("g_predictors") != std::string::npos) return from_wgkv(pth, std::move(tensors), shape);
  if (first.find("retention_gate") != std::string::npos)
    return from_trimkv(pth, config, std::move(tensors), shape);
  throw InputError(pth, first,
                   "neither a WG-KV (g_predictors) nor a TrimKV (retention_gate) gate checkpoint");
}

}  // namespace kvscope::gates
