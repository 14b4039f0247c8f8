#include "capture/gates/gate_set.h"

#include <openssl/evp.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "capture/formats/safetensors.h"
#include "capture/gates/official_checkpoints.h"
#include "capture/gates/torch_pickle.h"
#include "core/common/atomic_file.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

double GateSet::hyper(const std::string& key) const {
  const json& h = meta.at("hyperparameters");
  if (!h.contains(key) || !h[key].is_number())
    throw InputError(source, "hyperparameters." + key, "missing or not a number");
  return h[key].get<double>();
}

const torch::Tensor& GateSet::param(const std::string& name) const {
  auto it = params.find(name);
  if (it == params.end()) throw InputError(source, name, "tensor missing from the gate file");
  return it->second;
}

std::vector<torch::Tensor> GateSet::trainable() const {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : params) out.push_back(t);
  return out;
}

void GateSet::to(torch::Device device) {
  for (auto& [name, t] : params) t = t.to(device);
}

// ---- hyperparameters --------------------------------------------------------

// The range of every numeric hyperparameter: sizes are positive integers,
// tau is a probability threshold (WG-KV) or temperature (Attention-Gate).
struct HyperRange {
  const char* key;
  double lo, hi;
  bool integer;
};
constexpr HyperRange kHyperRanges[] = {
    {"window", 1, 1 << 20, true},
    {"expand", 1, 64, true},
    {"heads", 1, 1024, true},
    {"head_dim", 1, 4096, true},
    {"hidden", 1, 1 << 16, true},
    {"tau", 1e-9, 1e3, false},
    {"epsilon", 0, 1, false},
    {"norm_eps", 1e-12, 1, false},
    {"gamma", 0, 1e3, false},
    {"bias_init", -1e3, 1e3, false},
    {"sinks", 0, 1 << 20, true},
    {"topk", 1, 1 << 20, true},
    {"proj", 1, 4096, true},
    {"decay_step", 1, 1 << 20, true},
    // eq. 21: 0 < gamma_min < gamma_max < 1
    {"gamma_min", 1e-9, 0.9999999999, false},
    {"gamma_max", 1e-9, 0.9999999999, false},
    {"latent", 1, 256, true},
    {"horizon", 1, 1 << 20, true},
    {"ewma", 0, 0.999999, false},
    {"tau_quantile", 0.01, 0.999, false},
    {"alpha", 0.01, 1e3, false},
    {"focal_gamma", 0, 10, false},
    {"lead", 0, 1 << 20, true},
    {"latency_weight", 0, 1e3, false},
    {"ridge", 0, 1e9, false},
    {"dim", 1, 4096, true},
    {"base_keys", 0, 4096, true},
    {"iters", 1, 1e8, true},
    {"batch", 1, 1e8, true},
    {"sgd_lr", 1e-9, 1e3, false},
    {"scale", 1e-6, 1e6, false},
    {"offset", -1e3, 1e3, false},
    {"initial_cr", 1, 1e3, false},
    {"target_cr", 1, 1e3, false},
    {"ramp", 1e-3, 1, false},
    {"tokens", 1, 4096, true},
    {"rank", 1, 4096, true},
    {"keep", 1e-3, 1, false},
    {"context_share", 0.05, 0.95, false},
};

void check_hyperparameter_ranges(const json& h, const std::string& field) {
  for (const HyperRange& r : kHyperRanges) {
    if (!h.contains(r.key)) continue;
    const json& v = h[r.key];
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    char range[96];
    std::snprintf(range, sizeof range, "%s in [%.10g, %.10g]",
                  r.integer ? "an integer" : "a number", r.lo, r.hi);
    if (!std::isfinite(x) || x < r.lo || x > r.hi || (r.integer && x != std::floor(x)))
      throw InputError("", field + "." + r.key, "is " + v.dump() + " (expected " + range + ")");
  }
}

json resolve_hyperparameters(GateKind kind, const GateShape& shape, const json& given,
                             const std::string& field) {
  json h = default_hyperparameters(kind, shape);
  if (given.is_null()) return h;
  if (!given.is_object())
    throw InputError("", field, "an object of hyperparameters expected, got " + given.dump());
  for (auto it = given.begin(); it != given.end(); ++it) {
    if (!h.contains(it.key()))
      throw InputError(
          "", field,
          "'" + it.key() + "' is not a hyperparameter of " + gate_kind_name(kind) +
              " gates (known: " +
              [&] {
                std::string k;
                for (auto d = h.begin(); d != h.end(); ++d) k += (k.empty() ? "" : ", ") + d.key();
                return k;
              }() +
              ")");
    if (h[it.key()].is_string() != it.value().is_string())
      throw InputError("", field + "." + it.key(), "wrong type");
    h[it.key()] = it.value();
  }
  if (h.contains("activation") && h["activation"] != "silu" && h["activation"] != "gelu")
    throw InputError("", field + ".activation", "silu or gelu expected");
  check_hyperparameter_ranges(h, field);
  if (h.contains("readout") && h["readout"] != "delayed" && h["readout"] != "immediate")
    throw InputError("", field + ".readout",
                     "is " + h["readout"].dump() + " (expected \"delayed\" or \"immediate\")");
  if (h.contains("gamma_min") && !(h["gamma_min"].get<double>() < h["gamma_max"].get<double>()))
    throw InputError("", field + ".gamma_min",
                     "is " + h["gamma_min"].dump() + " (expected below gamma_max, " +
                         h["gamma_max"].dump() + ")");
  return h;
}

// ---- files --------------------------------------------------------------------

void save_gates(const GateSet& set, const std::string& path) {
  json header;
  json meta = set.meta;
  meta["policy"] = gate_kind_name(set.kind);
  header["__metadata__"] = {{"kvscope.gates", meta.dump()}};
  uint64_t offset = 0;
  std::vector<torch::Tensor> data;
  for (const auto& [name, t] : set.params) {
    torch::Tensor c = t.detach().to(torch::kFloat32).cpu().contiguous();  // trained on any device
    const uint64_t nbytes = uint64_t(c.numel()) * 4;
    header[name] = {
        {"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(c);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes
  write_stream_atomically(
      path,
      [&](std::ostream& out) {
        const uint64_t n = h.size();
        char len[8];
        for (int k = 0; k < 8; ++k) len[k] = char((n >> (8 * k)) & 0xff);
        out.write(len, 8);
        out.write(h.data(), std::streamsize(h.size()));
        for (const torch::Tensor& c : data)
          out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.numel() * 4));
      },
      "the gate file");
}

namespace {

GateShape shape_of(const model::ModelConfig& m) {
  return GateShape::of(m);
}

GateSet load_kvscope_file(const std::string& path, const model::ModelConfig& model) {
  formats::SafetensorsFile f(path);
  auto it = f.metadata().find("kvscope.gates");
  if (it == f.metadata().end())
    throw InputError(path, "__metadata__.kvscope.gates",
                     "missing: not a kvscope gate file (train one with `kvscope train`)");
  GateSet set;
  set.source = path;
  try {
    set.meta = json::parse(it->second);
  } catch (const std::exception& e) {
    throw InputError(path, "__metadata__.kvscope.gates", std::string("invalid JSON: ") + e.what());
  }
  // Every field is checked for its type before it is read: nlohmann's
  // value() throws its own type_error for a mistyped field.
  const json& meta = set.meta;
  if (!meta.is_object())
    throw InputError(path, "__metadata__.kvscope.gates", "a JSON object expected");
  if (!meta.contains("format") || meta["format"] != "kvscope-gates")
    throw InputError(path, "format", "'kvscope-gates' expected");
  if (!meta.contains("version") || !meta["version"].is_number_integer() || meta["version"] != 1)
    throw InputError(path, "version",
                     "gate file version " +
                         (meta.contains("version") ? meta["version"].dump() : "missing") +
                         " is not read by this KVScope (it reads version 1)");
  if (!meta.contains("policy") || !meta["policy"].is_string())
    throw InputError(
        path, "policy",
        "a gate kind name expected (wgkv, attention-gate, retention, retention-global)");
  set.kind = parse_gate_kind(meta["policy"].get<std::string>(), path, "policy");
  set.shape = shape_of(model);
  try {
    set.meta["hyperparameters"] = resolve_hyperparameters(
        set.kind, set.shape,
        meta.contains("hyperparameters") ? meta["hyperparameters"] : json::object(),
        "hyperparameters");
  } catch (const InputError& e) {
    // resolve_hyperparameters names no file (it serves the CLI too): add it.
    std::string what = e.what();
    if (what.rfind(e.field() + ": ", 0) == 0) what = what.substr(e.field().size() + 2);
    throw InputError(path, e.field(), what);
  }
  for (const auto& [name, t] : f.tensors()) {
    if (t.dtype != formats::StDtype::F32)
      throw InputError(path, name, "dtype " + t.dtype_name + ", F32 expected");
    torch::Tensor x =
        torch::from_blob(const_cast<uint8_t*>(f.data(t)), t.shape, torch::kFloat32).clone();
    set.params[name] = x;
  }
  return set;
}

std::string dims(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t k = 0; k < d.size(); ++k) s += (k ? ", " : "") + std::to_string(d[k]);
  return s + "]";
}

}  // namespace

namespace {

// The layer of "layers.<l>.<rest>", or -1 for any other name (a tensor that
// is not a parameter of these gates, reported as such below).
int64_t layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  int64_t l = 0;
  size_t i = 7;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    l = l * 10 + (name[i] - '0');
    if (l > (int64_t(1) << 24)) return -1;
  }
  return i > 7 && i < name.size() && name[i] == '.' ? l : -1;
}

}  // namespace

void check_fits(const GateSet& set, const model::ModelConfig& model) {
  const GateShape s = shape_of(model);
  const json& h = set.meta.at("hyperparameters");
  const auto want = expected_parameters(set.kind, h, s);
  std::vector<std::string> problems;
  int64_t file_layers = 0;
  for (const auto& [name, t] : set.params)
    file_layers = std::max<int64_t>(file_layers, layer_of(name) + 1);
  if (file_layers != s.n_layers)
    problems.push_back("the file has gates for " + std::to_string(file_layers) +
                       " layers, the model has " + std::to_string(s.n_layers));
  for (const auto& [name, d] : want) {
    auto it = set.params.find(name);
    if (it == set.params.end()) {
      if (problems.size() < 12) problems.push_back(name + " is missing");
      continue;
    }
    if (it->second.sizes().vec() != d && problems.size() < 12)
      problems.push_back(name + " has shape " + dims(it->second.sizes().vec()) +
                         ", the model needs " + dims(d));
  }
  for (const auto& [name, t] : set.params)
    if (!want.count(name) && problems.size() < 12)
      problems.push_back(name + " is not a parameter of this model's " +
                         std::string(gate_kind_name(set.kind)) + " gates");
  if (problems.empty()) return;
  std::string msg = std::string(gate_kind_name(set.kind)) + " gates do not fit " + model.name +
                    " (" + std::to_string(s.n_layers) + " layers, " + std::to_string(s.n_kv_heads) +
                    " kv heads, head_dim " + std::to_string(s.head_dim) + ", hidden " +
                    std::to_string(s.hidden_size) + "): ";
  for (size_t k = 0; k < problems.size(); ++k) msg += (k ? "; " : "") + problems[k];
  if (problems.size() >= 12) msg += "; ...";
  if (set.meta.contains("base_model") && set.meta["base_model"].is_object() &&
      set.meta["base_model"].contains("name") && set.meta["base_model"]["name"].is_string())
    msg += " (the file was trained for " + set.meta["base_model"]["name"].get<std::string>() + ")";
  throw InputError(set.source, "shape", msg);
}

GateSet load_gates(const std::string& path, const model::ModelConfig& model) {
  if (path.empty()) throw InputError("", "gates", "a gate file is required");
  if (!fs::exists(path)) throw InputError(path, "", "no such gate file");
  GateSet set;
  if (fs::is_directory(path) || looks_like_torch_save(path))
    set = load_official_checkpoint(path, GateShape::of(model));
  else
    set = load_kvscope_file(path, model);
  check_fits(set, model);
  return set;
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), size_t(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  char b[3];
  for (unsigned int k = 0; k < n; ++k) {
    std::snprintf(b, sizeof b, "%02x", md[k]);
    hex += b;
  }
  return hex;
}

}  // namespace kvscope::gates
