// The gate kinds, one table entry each: its name in gate files, its
// hyperparameters' defaults (the papers' and the official code's values), the
// shapes of its tensors and how a fresh set is initialised. A new gate kind is
// its enum value in gate_set.h and its entry here. docs/architecture.md
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "capture/gates/gate_set.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

using nlohmann::json;

std::vector<LoraProjection> restorekv_projections(const GateShape& s) {
  const int64_t D = s.hidden_size, Q = s.n_heads * s.head_dim, KV = s.n_kv_heads * s.head_dim,
                I = s.ffn_size;
  return {{"q", D, Q},    {"k", D, KV}, {"v", D, KV},  {"o", Q, D},
          {"gate", D, I}, {"up", D, I}, {"down", I, D}};
}

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// What initialising one tensor may read: the set's hyperparameters, the
// model's shape and the shapes of all the set's tensors.
struct InitInput {
  const json& hyper;
  const GateShape& shape;
  const Shapes& shapes;
};

struct GateKindSpec {
  GateKind kind;
  const char* name;
  std::function<json(const GateShape&)> defaults;
  // The tensors of one layer (names under the prefix "layers.<l>.").
  std::function<void(const json& h, const GateShape& s, const std::string& p, Shapes& out)> layer;
  // The tensors the layers share (may be empty).
  std::function<void(const json& h, const GateShape& s, Shapes& out)> shared;
  std::function<void(const std::string& name, torch::Tensor& t, const InitInput& in)> init;
};

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

void init_zero(const std::string&, torch::Tensor& t, const InitInput&) {
  t.zero_();
}

// ---- WG-KV (seed 000) ---------------------------------------------------------

void wgkv_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t K = s.n_kv_heads, hd = s.head_dim;
  const int64_t inner = int64_t(h.at("expand").get<double>() * double(hd));
  const std::string g = p + "self_attn.g_predictors.";
  out[g + "pre_key_norm.weight"] = {hd};
  out[g + "post_key_norm.weight"] = {hd};
  out[g + "conv1.weight"] = {K * inner, 2 * hd, 1};
  out[g + "conv1.bias"] = {K * inner};
  out[g + "conv2.weight"] = {K, inner, 1};
  out[g + "conv2.bias"] = {K};
}

// nn.Conv1d.reset_parameters: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// (kaiming_uniform with a = sqrt(5) gives the same bound); RMSNorm weights 1.
void wgkv_init(const std::string& name, torch::Tensor& t, const InitInput& in) {
  if (name.find("_norm.weight") != std::string::npos) {
    t.fill_(1.0);
    return;
  }
  const std::vector<int64_t>& wd = in.shapes.at(name.substr(0, name.rfind('.')) + ".weight");
  const double bound = 1.0 / std::sqrt(double(wd[1] * wd[2]));
  t.uniform_(-bound, bound);
}

// ---- Attention-Gate (seed 001) --------------------------------------------------

void attention_gate_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t w = h.at("heads").get<int64_t>() * h.at("head_dim").get<int64_t>();
  for (const char* m : {"q_proj", "k_proj", "v_proj"})
    out[p + "attention_gate." + m + ".weight"] = {w, s.hidden_size};
  out[p + "attention_gate.o_proj.weight"] = {s.n_kv_heads, w};
}

// ---- TrimKV retention gates (seed 002) ----------------------------------------------

void retention_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t I = h.at("hidden").get<int64_t>();
  const std::string g = p + "self_attn.retention_gate.";
  out[g + "linear1.weight"] = {I, s.hidden_size};
  out[g + "linear1.bias"] = {I};
  out[g + "linear2.weight"] = {s.n_kv_heads, I};
  out[g + "bias"] = {s.n_kv_heads};
}

void retention_global_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t I = h.at("hidden").get<int64_t>();
  const std::string g = p + "self_attn.retention_gate.";
  out[g + "linear1.weight"] = {s.n_kv_heads * I, s.hidden_size};
  out[g + "linear1.bias"] = {s.n_kv_heads * I};
}

void retention_global_shared(const json& h, const GateShape&, Shapes& out) {
  out["retention_gate_shared.linear2.weight"] = {1, h.at("hidden").get<int64_t>()};
  out["retention_gate_shared.bias"] = {1};
}

// TrimKV RetentionGate.reset_parameters: weights N(0, 0.02), linear1 bias 0,
// the final bias retention_gate_bias_init (beta ~ 1 at start).
void retention_init(const std::string& name, torch::Tensor& t, const InitInput& in) {
  if (name.find("linear1.bias") != std::string::npos)
    t.zero_();
  else if (ends_with(name, ".bias"))
    t.fill_(in.hyper.at("bias_init").get<double>());
  else
    t.normal_(0.0, 0.02);
}

// ---- KVpop (seed 003) -------------------------------------------------------------

// The budget the scorer was trained for (seed 003 Table 3: s = 4, w = 256,
// k = 2016 at 16K; here scaled to a 2K context at 88 % compression:
// B = 4 + 64 + 188 = 256) and the decay range of eq. 21.
json kvpop_defaults() {
  return {{"sinks", 4},         {"window", 64},          {"topk", 188},
          {"gamma_min", 0.999}, {"gamma_max", 0.999999}, {"decay_step", 1}};
}

json kvpop_mlp_defaults(const GateShape& s) {
  json h = kvpop_defaults();
  h["hidden"] = 2 * s.head_dim;  // the paper leaves the width open: the input's
  return h;
}

json kvpop_mlstm_defaults(const GateShape& s) {
  json h = kvpop_defaults();
  h["proj"] = std::max<int64_t>(1, s.head_dim / 2);  // E.3: d/2, Hedgehog doubles it
  h["readout"] = "delayed";                          // E.4; "immediate": the ablation
  return h;
}

void kvpop_mlp_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t K = s.n_kv_heads, hd = s.head_dim, I = h.at("hidden").get<int64_t>();
  out[p + "kvpop.decay_logit"] = {K};
  out[p + "kvpop.mlp.w1"] = {K, 2 * hd, I};
  out[p + "kvpop.mlp.b1"] = {K, I};
  out[p + "kvpop.mlp.w2"] = {K, I};
  out[p + "kvpop.mlp.b2"] = {K};
}

void kvpop_mlstm_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t K = s.n_kv_heads, hd = s.head_dim, P = h.at("proj").get<int64_t>();
  const std::string g = p + "kvpop.mlstm.";
  out[p + "kvpop.decay_logit"] = {K};
  for (const char* m : {"wq", "wk", "wv"}) out[g + m] = {K, 2 * hd, P};
  for (const char* m : {"wi", "wf"}) out[g + m] = {K, 2 * hd};
  for (const char* m : {"bi", "bf", "out_b"}) out[g + m] = {K};
  out[g + "out_w"] = {K, P};
}

// KVpop (seed 003 E.5): the final score projection starts at zero, so every
// token scores alike and the ranking starts as pure recency (the decay term);
// the mLSTM's query and key projections start as a selection of the key's
// first P dims, the value projection of the value's (identity-style maps
// from the cached key and value), plus N(0, 0.02) so heads differ; the
// forget-gate bias starts at 3 (sigmoid 0.95: a memory of ~20 tokens).
void kvpop_init(const std::string& name, torch::Tensor& t, const InitInput& in) {
  const int64_t hd = in.shape.head_dim;
  if (ends_with(name, ".decay_logit") || ends_with(name, ".b1") || ends_with(name, ".b2") ||
      ends_with(name, ".bi") || ends_with(name, ".out_b") || ends_with(name, ".w2") ||
      ends_with(name, ".out_w")) {
    t.zero_();
  } else if (ends_with(name, ".bf")) {
    t.fill_(3.0);
  } else if (ends_with(name, ".w1")) {  // nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    const double bound = 1.0 / std::sqrt(double(2 * hd));
    t.uniform_(-bound, bound);
  } else {
    t.normal_(0.0, 0.02);
    const bool value = ends_with(name, ".wv");
    if (ends_with(name, ".wq") || ends_with(name, ".wk") || value)
      for (int64_t i = 0; i < t.size(2); ++i)
        t.select(1, (value ? hd : 0) + i % hd).select(1, i) += 1.0;
  }
}

// ---- Salience Forecasting Cache (seed 004) -------------------------------------------

// Seed 004 gives the features, tau (the 90th percentile), alpha = 6 and
// H = 512 at 128K; the sizes, the EWMA decay and H scaled to our contexts are
// ours (docs/policies/sfc.md, "Decisions").
json sfc_defaults(const GateShape&) {
  return {{"hidden", 8},        {"latent", 8},         {"horizon", 32},
          {"ewma", 0.8},        {"tau_quantile", 0.9}, {"alpha", 6.0},
          {"focal_gamma", 2.0}, {"lead", 2},           {"latency_weight", 1.0}};
}

void sfc_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t K = s.n_kv_heads, G = h.at("hidden").get<int64_t>(),
                Z = h.at("latent").get<int64_t>();
  out[p + "sfc.latent"] = {K, s.head_dim, Z};
  out[p + "sfc.w_ih"] = {K, 3 * G, 4 + Z};
  out[p + "sfc.w_hh"] = {K, 3 * G, G};
  out[p + "sfc.b_ih"] = {K, 3 * G};
  out[p + "sfc.b_hh"] = {K, 3 * G};
}

void sfc_shared(const json& h, const GateShape&, Shapes& out) {
  out["sfc_shared.head.weight"] = {2, h.at("hidden").get<int64_t>()};
  out["sfc_shared.head.bias"] = {2};
}

// nn.GRU's U(-1/sqrt(G), 1/sqrt(G)) for the GRU and the head; the latent
// projection N(0, 1/hd) (a random projection that keeps the key's scale); the
// head's horizon bias at -2 (sigmoid 0.12: most tokens are cold).
void sfc_init(const std::string& name, torch::Tensor& t, const InitInput& in) {
  if (ends_with(name, ".latent")) {
    t.normal_(0.0, 1.0 / std::sqrt(double(in.shape.head_dim)));
  } else if (ends_with(name, "head.bias")) {
    t.fill_(-2.0);
  } else {
    const int64_t G = name.find("head") != std::string::npos ? t.size(1) : t.size(1) / 3;
    const double bound = 1.0 / std::sqrt(double(G));
    t.uniform_(-bound, bound);
  }
}

// ---- RestoreKV ----------------------------------------------------------------------

// The released RestoreKV adapters: 8 restore tokens, rank-8 LoRA with alpha
// 16 on q/k/v/o/gate/up/down. What the paper's card leaves open is ours
// (docs/policies/restorekv.md): the KVzip budget the training evicts to (keep,
// a share of the context), the share of each window that is context (the
// rest is the continuation the KL is taken on) and KVzip's sinks.
json restorekv_defaults(const GateShape&) {
  return {{"tokens", 8},           {"rank", 8}, {"alpha", 16.0}, {"keep", 0.25},
          {"context_share", 0.75}, {"sinks", 4}};
}

void restorekv_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t r = h.at("rank").get<int64_t>();
  for (const LoraProjection& m : restorekv_projections(s)) {
    out[p + "lora." + m.name + ".a"] = {r, m.in};
    out[p + "lora." + m.name + ".b"] = {m.out, r};
  }
}

void restorekv_shared(const json& h, const GateShape& s, Shapes& out) {
  out["restore_embeddings"] = {h.at("tokens").get<int64_t>(), s.hidden_size};
}

// PEFT's LoRA: A kaiming-uniform (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B
// zero, so the adapted model starts as the base. The restore embeddings start
// as N(0, 0.02); the trainer replaces them by rows of the model's own
// embedding table.
void restorekv_init(const std::string& name, torch::Tensor& t, const InitInput&) {
  if (ends_with(name, ".a"))
    t.uniform_(-1.0 / std::sqrt(double(t.size(1))), 1.0 / std::sqrt(double(t.size(1))));
  else if (ends_with(name, ".b"))
    t.zero_();
  else
    t.normal_(0.0, 0.02);
}

// ---- the fitted and calibrated kinds (nothing to initialise: zero) -------------

void fastkvzip_layer(const json& h, const GateShape& s, const std::string& p, Shapes& out) {
  const int64_t dim = h.at("dim").get<int64_t>(), base = h.at("base_keys").get<int64_t>();
  const int64_t K = s.n_kv_heads, G = s.n_heads / K;
  const std::string f = p + "fastkvzip.";
  out[f + "q_proj.weight"] = {K * G * dim, s.hidden_size};
  out[f + "q_proj.bias"] = {K * G * dim};
  out[f + "k_proj.weight"] = {K * dim, s.hidden_size};
  out[f + "q_norm.weight"] = {dim};
  out[f + "k_norm.weight"] = {dim};
  out[f + "b"] = {K, 1, G};
  if (base > 0) out[f + "k_base"] = {K, 1, base, dim};
}

// The table: one entry per gate kind, in GateKind's order.
const std::vector<GateKindSpec>& gate_kind_specs() {
  static const std::vector<GateKindSpec> specs = {
      {GateKind::WriteGate, "wgkv",
       [](const GateShape&) -> json {  // official WG-KV config defaults (seed 000 §5.1)
         return {{"window", 256},   {"tau", 0.1},       {"expand", 4},
                 {"epsilon", 1e-3}, {"norm_eps", 1e-6}, {"activation", "gelu"}};
       },
       wgkv_layer, nullptr, wgkv_init},
      {GateKind::AttentionGate, "attention-gate",
       [](const GateShape& s) -> json {  // seed 001 §4.1 (CPT setting), Table 3 (1): 4 heads
         return {{"heads", 4}, {"head_dim", s.head_dim}, {"tau", 0.5}, {"gamma", 2.0}};
       },
       attention_gate_layer, nullptr,
       [](const std::string&, torch::Tensor& t, const InitInput&) {
         torch::nn::init::xavier_uniform_(t);  // Xavier (Glorot) uniform, seed 001 §3.5
       }},
      {GateKind::Retention, "retention",
       [](const GateShape&) -> json {  // official TrimKV config defaults
         return {{"hidden", 512}, {"activation", "silu"}, {"bias_init", 10.0}};
       },
       retention_layer, nullptr, retention_init},
      {GateKind::RetentionGlobal, "retention-global",
       [](const GateShape&) -> json {
         return {{"hidden", 64}, {"activation", "silu"}, {"bias_init", 10.0}};
       },
       retention_global_layer, retention_global_shared, retention_init},
      {GateKind::KvpopMlp, "kvpop-mlp", kvpop_mlp_defaults, kvpop_mlp_layer, nullptr, kvpop_init},
      {GateKind::KvpopMlstm, "kvpop-mlstm", kvpop_mlstm_defaults, kvpop_mlstm_layer, nullptr,
       kvpop_init},
      {GateKind::SfcGru, "sfc-gru", sfc_defaults, sfc_layer, sfc_shared, sfc_init},
      {GateKind::QFilter, "qfilter",
       [](const GateShape&) { return json::object(); },  // calibrated, nothing to choose
       [](const json&, const GateShape& s, const std::string& p, Shapes& out) {
         out[p + "qfilter"] = {s.n_kv_heads, s.head_dim};
       },
       nullptr, init_zero},  // calibrated (query_calibration.cpp), never trained
      {GateKind::QueryStats, "query-stats",
       // first queries of each window left out (kvpress n_sink)
       [](const GateShape&) -> json {
         return {{"sinks", 4}};
       },
       [](const json&, const GateShape& s, const std::string& p, Shapes& out) {
         out[p + "query_mean"] = {s.n_heads, s.head_dim};
         out[p + "query_cov"] = {s.n_heads, s.head_dim, s.head_dim};
       },
       nullptr, init_zero},
      {GateKind::Kvzap, "kvzap",
       // kvpress kvzap/train.py's linear surrogate: scikit-learn's Ridge() (alpha 1).
       [](const GateShape&) -> json {
         return {{"ridge", 1.0}};
       },
       [](const json&, const GateShape& s, const std::string& p, Shapes& out) {
         out[p + "kvzap.weight"] = {s.n_kv_heads, s.hidden_size};
         out[p + "kvzap.bias"] = {s.n_kv_heads};
       },
       nullptr, init_zero},  // fitted in closed form (kvzap_calibration.cpp)
      {GateKind::FastKvzip, "fastkvzip",
       // The official trainer's (optim.py): a 16-dim gate with 16 learned sink
       // keys, SGD (momentum 0.9) at 0.2 for 5000 steps of 1000 tokens.
       [](const GateShape&) -> json {
         return {{"dim", 16}, {"base_keys", 16}, {"iters", 5000}, {"batch", 1000}, {"sgd_lr", 0.2}};
       },
       fastkvzip_layer, nullptr, init_zero},  // initialised by its trainer
      {GateKind::Dms, "dms",
       // NVIDIA's DMS adapter recipe (Model-Optimizer experimental/dms,
       // Qwen3ConfigDMS): decision logits scale 100, offset 5, Gumbel-sigmoid
       // temperature 0.1, the compression ratio ramped linearly from 1 to the
       // target over the run. The window (512 there, for 32K contexts) is
       // scaled to ours.
       [](const GateShape&) -> json {
         return {{"window", 256},     {"tau", 0.1},       {"scale", 100.0}, {"offset", 5.0},
                 {"initial_cr", 1.0}, {"target_cr", 4.0}, {"ramp", 1.0}};
       },
       [](const json&, const GateShape& s, const std::string& p, Shapes& out) {
         out[p + "dms.weight"] = {s.n_kv_heads, s.hidden_size};
       },
       nullptr, init_zero},  // zero, as the recipe (zero_out_proj_alpha): logit -offset
      {GateKind::RestoreKv, "restorekv", restorekv_defaults, restorekv_layer, restorekv_shared,
       restorekv_init},
  };
  return specs;
}

const GateKindSpec& spec_of(GateKind kind) {
  const std::vector<GateKindSpec>& specs = gate_kind_specs();
  const size_t i = static_cast<size_t>(kind);
  KVSCOPE_CHECK(i < specs.size() && specs[i].kind == kind,
                "gate kind " + std::to_string(i) + " has no entry in gate_kind_specs()");
  return specs[i];
}

}  // namespace

const char* gate_kind_name(GateKind k) {
  return spec_of(k).name;
}

GateKind parse_gate_kind(const std::string& name, const std::string& file,
                         const std::string& field) {
  std::string known;
  for (const GateKindSpec& s : gate_kind_specs()) {
    if (name == s.name) return s.kind;
    known += (known.empty() ? "" : ", ") + std::string(s.name);
  }
  throw InputError(file, field, "'" + name + "' is not a gate kind (" + known + ")");
}

json default_hyperparameters(GateKind kind, const GateShape& s) {
  return spec_of(kind).defaults(s);
}

std::map<std::string, std::vector<int64_t>> expected_parameters(GateKind kind, const json& h,
                                                                const GateShape& s) {
  const GateKindSpec& spec = spec_of(kind);
  Shapes out;
  for (int64_t l = 0; l < s.n_layers; ++l)
    spec.layer(h, s, "layers." + std::to_string(l) + ".", out);
  if (spec.shared) spec.shared(h, s, out);
  return out;
}

GateSet init_gates(GateKind kind, const json& hyper, const GateShape& shape, uint64_t seed) {
  GateSet set;
  set.kind = kind;
  set.shape = shape;
  set.meta = {{"format", "kvscope-gates"},
              {"version", 1},
              {"policy", gate_kind_name(kind)},
              {"hyperparameters", hyper}};
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  const Shapes shapes = expected_parameters(kind, hyper, shape);
  const InitInput in{hyper, shape, shapes};
  for (const auto& [name, dims] : shapes) {
    torch::Tensor t = torch::empty(dims, torch::kFloat32);
    spec_of(kind).init(name, t, in);
    set.params[name] = t;
  }
  return set;
}

}  // namespace kvscope::gates
