#include <cmath>
#include <filesystem>
#include <fstream>

#include "capture/train/train_options.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

std::string sidecar_path(const std::string& output, const std::string& ext) {
  std::string base = output;
  for (const std::string st : {".safetensors", ".bin", ".npy"})
    if (base.size() > st.size() && base.compare(base.size() - st.size(), st.size(), st) == 0) {
      base.resize(base.size() - st.size());
      break;
    }
  return base + ext;
}

TrainResult save_fitted_gates(GateSet set, const model::ModelConfig& c, const TrainOptions& o,
                              json training, std::chrono::steady_clock::time_point t0) {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  training["seed"] = o.seed;
  training["device"] = o.model.device;
  training["command"] = o.command_line;
  training["wall_seconds"] = wall;
  set.meta["base_model"] = model_json(c, c.name, o.model.model, o.model.model);
  set.meta["training"] = training;
  save_gates(set, o.output);
  std::ofstream js(sidecar_path(o.output, ".json"));
  js << set.meta.dump(2) << "\n";
  TrainResult r;
  r.summary = training;
  r.wall_seconds = wall;
  return r;
}

double warmup_cosine_lr(const TrainOptions& o, int64_t step) {
  const double share =
      o.warmup_steps >= 0 ? double(std::min(o.warmup_steps, o.steps)) : o.warmup * double(o.steps);
  const double warm = std::max(1.0, share);
  if (double(step) < warm) return o.lr * double(step + 1) / warm;
  const double t = (double(step) - warm) / std::max(1.0, double(o.steps) - warm);
  return o.lr_min + (o.lr - o.lr_min) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t)));
}

// `name` is checked by the kvpop policy; `sha256` finds shipped gates
// (gate_search.cpp).
json model_json(const model::ModelConfig& c, const std::string& name, const std::string& path,
                const std::string& hashed_file) {
  return {{"name", name},
          {"file", fs::path(path).filename().string()},
          {"sha256", file_sha256(hashed_file)},
          {"n_layers", c.n_layers},
          {"n_kv_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"hidden_size", c.hidden_size}};
}

}  // namespace kvscope::gates
