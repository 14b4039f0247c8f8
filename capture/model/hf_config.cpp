#include "capture/model/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/common/input_error.h"

namespace kvscope::model {

namespace {

using nlohmann::json;

class Fields {
 public:
  Fields(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  bool has_key(const char* key) const { return j_.contains(key); }
  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key) const {
    if (!present(key)) throw InputError(file_, key, "required field is missing");
    return integer_value(key, j_[key]);
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return present(key) ? integer_value(key, j_[key]) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_number()) throw InputError(file_, key, "must be a number");
    return j_[key].get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_boolean()) throw InputError(file_, key, "must be true or false");
    return j_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_string()) throw InputError(file_, key, "must be a string");
    return j_[key].get<std::string>();
  }
  const json& raw(const char* key) const { return j_[key]; }
  const std::string& file() const { return file_; }

 private:
  int64_t integer_value(const std::string& key, const json& v) const {
    if (!v.is_number_integer()) throw InputError(file_, key, "must be an integer");
    // Above 2^63 - 1: refused, not wrapped to a negative value.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw InputError(file_, key, v.dump() + " is outside the 64-bit integer range");
    return v.get<int64_t>();
  }
  const json& j_;
  std::string file_;
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    json j = json::parse(ss.str());
    if (!j.is_object()) throw InputError(path, "", "must be a JSON object");
    return j;
  } catch (const json::exception& e) {
    throw InputError(path, "", std::string("invalid JSON: ") + e.what());
  }
}

// Every family KVScope runs, by its transformers class: model_type is
// architecture_name(), the class the fallback when a config has no model_type.
struct Family {
  const char* hf_class;
  Architecture arch;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", Architecture::Llama},       {"MistralForCausalLM", Architecture::Mistral},
    {"Qwen2ForCausalLM", Architecture::Qwen2},       {"Qwen3ForCausalLM", Architecture::Qwen3},
    {"GPT2LMHeadModel", Architecture::Gpt2},         {"MixtralForCausalLM", Architecture::Mixtral},
    {"Qwen3MoeForCausalLM", Architecture::Qwen3Moe}, {"OlmoeForCausalLM", Architecture::Olmoe},
    {"Phi3ForCausalLM", Architecture::Phi3}};

Architecture architecture_of(const json& j, const std::string& file) {
  std::string type, hf_class;
  if (j.contains("model_type") && j["model_type"].is_string()) {
    type = j["model_type"].get<std::string>();
  } else if (j.contains("architectures") && j["architectures"].is_array() &&
             !j["architectures"].empty() && j["architectures"][0].is_string()) {
    hf_class = type = j["architectures"][0].get<std::string>();
  } else {
    throw InputError(file, "model_type", "missing (and no architectures list to infer it from)");
  }
  std::string known;
  for (const Family& f : kFamilies) {
    if (hf_class.empty() ? type == architecture_name(f.arch) : hf_class == f.hf_class)
      return f.arch;
    known += std::string(known.empty() ? "" : ", ") + architecture_name(f.arch);
  }
  throw InputError(file, "model_type",
                   "unknown architecture \"" + type + "\" (KVScope runs " + known + ")");
}

// A token id: an integer in [0, 2^31 - 1]. get<int32_t>() would keep the
// low 32 bits of a larger value (2^32 + 248 became 248).
int32_t token_id(const json& v, const std::string& file, const std::string& key) {
  if (!v.is_number_integer())
    throw InputError(file, key, "must be an integer or a list of integers");
  const bool in_range = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                            : v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  if (!in_range)
    throw InputError(file, key,
                     v.dump() + " is outside [0, " + std::to_string(INT32_MAX) + "] (a token id)");
  return static_cast<int32_t>(v.get<int64_t>());
}

std::vector<int32_t> token_ids(const json& v, const std::string& file, const char* key) {
  std::vector<int32_t> ids;
  if (v.is_null()) return ids;
  if (v.is_number_integer()) return {token_id(v, file, key)};
  if (!v.is_array()) throw InputError(file, key, "must be an integer or a list of integers");
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(token_id(v[i], file, std::string(key) + "[" + std::to_string(i) + "]"));
  return ids;
}

void parse_longrope(const Fields& f, const json& s, const std::string& key, ModelConfig* c);

// rope_parameters (transformers v5) or rope_scaling + rope_theta (legacy).
void parse_rope(const Fields& f, ModelConfig* c) {
  RopeConfig& r = c->rope;
  r.dim = c->head_dim;
  r.theta = f.number_or("rope_theta", 10000.0);
  if (f.present("partial_rotary_factor")) {
    double p = f.number_or("partial_rotary_factor", 1.0);
    r.dim = static_cast<int64_t>(std::llround(static_cast<double>(c->head_dim) * p));
  }
  const char* key = f.present("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!f.present(key)) return;
  const json& s = f.raw(key);
  if (!s.is_object()) throw InputError(f.file(), key, "must be an object or null");
  const std::string k = key;
  Fields sf(s, f.file());
  if (sf.present("rope_theta")) r.theta = sf.number_or("rope_theta", r.theta);
  std::string type = sf.string_or("rope_type", sf.string_or("type", "default"));
  if (type == "default") return;
  if (type == "longrope" || type == "su") return parse_longrope(f, s, k, c);
  r.factor = sf.number_or("factor", 0.0);
  if (!(r.factor > 0)) throw InputError(f.file(), k + ".factor", "required and must be positive");
  if (type == "linear") {
    r.scaling = RopeConfig::Scaling::Linear;
  } else if (type == "dynamic") {
    r.scaling = RopeConfig::Scaling::Dynamic;
    r.original_max_positions = c->context_length;
  } else if (type == "llama3") {
    r.scaling = RopeConfig::Scaling::Llama3;
    r.low_freq_factor = sf.number_or("low_freq_factor", 0.0);
    r.high_freq_factor = sf.number_or("high_freq_factor", 0.0);
    if (!sf.present("original_max_position_embeddings"))
      throw InputError(f.file(), k + ".original_max_position_embeddings", "required for llama3");
    r.original_max_positions = sf.integer("original_max_position_embeddings");
    if (!(r.low_freq_factor > 0))
      throw InputError(f.file(), k + ".low_freq_factor", "required and must be positive");
  } else {
    throw InputError(
        f.file(), k + ".rope_type",
        "RoPE scaling \"" + type +
            "\" is not supported (KVScope implements default, linear, dynamic, llama3, longrope)");
  }
}

// A list of `n` positive numbers at `name` of `s` (`parent` names `s` in errors).
std::vector<double> factor_list(const json& s, const std::string& file, const std::string& parent,
                                const char* name, size_t n) {
  const std::string key = parent + "." + name;
  if (!s.contains(name) || !s[name].is_array())
    throw InputError(file, key,
                     "required for longrope: a list of " + std::to_string(n) + " numbers");
  const json& list = s[name];
  if (list.size() != n)
    throw InputError(file, key,
                     "has " + std::to_string(list.size()) +
                         " entries, expected rotary dim / 2 = " + std::to_string(n));
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) {
    if (!list[i].is_number() || !(list[i].get<double>() > 0))
      throw InputError(file, key + "[" + std::to_string(i) + "]", "must be a positive number");
    out.push_back(list[i].get<double>());
  }
  return out;
}

// LongRoPE (Phi-3; older configs say "su"): transformers'
// _compute_longrope_parameters. The factor defaults to max_position_embeddings
// / original_max_position_embeddings, the attention factor to
// sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1).
void parse_longrope(const Fields& f, const json& s, const std::string& key, ModelConfig* c) {
  RopeConfig& r = c->rope;
  Fields sf(s, f.file());
  r.scaling = RopeConfig::Scaling::LongRope;
  r.original_max_positions =
      sf.integer_or("original_max_position_embeddings",
                    f.integer_or("original_max_position_embeddings", c->context_length));
  if (r.original_max_positions <= 0)
    throw InputError(f.file(), "original_max_position_embeddings", "must be positive");
  const size_t half = static_cast<size_t>(std::max<int64_t>(r.dim, 0) / 2);
  r.short_factor = factor_list(s, f.file(), key, "short_factor", half);
  r.long_factor = factor_list(s, f.file(), key, "long_factor", half);
  r.factor = sf.present("factor") ? sf.number_or("factor", 1.0)
                                  : double(c->context_length) / double(r.original_max_positions);
  if (sf.present("attention_factor")) {
    r.attention_factor = sf.number_or("attention_factor", 1.0);
  } else {
    r.attention_factor =
        r.factor <= 1.0
            ? 1.0
            : std::sqrt(1 + std::log(r.factor) / std::log(double(r.original_max_positions)));
  }
  if (!(r.attention_factor > 0))
    throw InputError(f.file(), key + ".attention_factor", "must be positive");
}

// OLMoE: one RMSNorm over all of q (hidden_size wide) and one over all of k,
// and clip_qkv. Its norms are sized from hidden_size, so head_dim must be
// hidden_size / num_attention_heads.
void parse_olmoe_attention(const Fields& f, ModelConfig* c) {
  c->qk_norm_whole = true;
  if (c->q_dim() != c->hidden_size)
    throw InputError(f.file(), "head_dim",
                     std::to_string(c->head_dim) +
                         " x num_attention_heads=" + std::to_string(c->n_heads) +
                         " must equal hidden_size=" + std::to_string(c->hidden_size) +
                         " (OLMoE's q norm is hidden_size wide)");
  c->clip_qkv = f.number_or("clip_qkv", 0.0);
  if (!(c->clip_qkv >= 0)) throw InputError(f.file(), "clip_qkv", "must be positive or null");
}

// The router and experts (transformers 5.2 configs): Mixtral routes every layer and
// always renormalises; Qwen3-MoE routes the layers that are not in
// mlp_only_layers and fall on decoder_sparse_step; both Qwen3-MoE and OLMoE
// renormalise only with norm_topk_prob.
void parse_moe(const Fields& f, ModelConfig* c) {
  const Architecture a = c->arch;
  MoeConfig& m = c->moe;
  const char* experts_key =
      a == Architecture::Mixtral || !f.present("num_experts") ? "num_local_experts" : "num_experts";
  m.n_experts = f.integer_or(experts_key, a == Architecture::Mixtral    ? 8
                                          : a == Architecture::Qwen3Moe ? 128
                                                                        : 64);
  m.top_k = f.integer_or("num_experts_per_tok", a == Architecture::Mixtral ? 2 : 8);
  m.intermediate_size = a == Architecture::Qwen3Moe ? f.integer_or("moe_intermediate_size", 768)
                                                    : c->intermediate_size;
  m.normalize_top_k = a == Architecture::Mixtral || f.boolean_or("norm_topk_prob", false);
  for (const char* shared : {"shared_expert_intermediate_size", "n_shared_experts"})
    if (f.integer_or(shared, 0) != 0)
      throw InputError(f.file(), shared, "shared experts are not supported by this family");
  if (m.n_experts <= 0) throw InputError(f.file(), experts_key, "must be positive");
  if (m.top_k > m.n_experts)
    throw InputError(
        f.file(), "num_experts_per_tok",
        std::to_string(m.top_k) + " exceeds " + experts_key + "=" + std::to_string(m.n_experts));
  c->check_limits(f.file());
  m.sparse.assign(static_cast<size_t>(c->n_layers), true);
  if (a != Architecture::Qwen3Moe) return;
  const int64_t step = f.integer_or("decoder_sparse_step", 1);
  if (step < 1)
    throw InputError(f.file(), "decoder_sparse_step",
                     "must be at least 1, got " + std::to_string(step));
  for (int64_t l = 0; l < c->n_layers; ++l) m.sparse[static_cast<size_t>(l)] = (l + 1) % step == 0;
  if (!f.present("mlp_only_layers")) return;
  const json& dense = f.raw("mlp_only_layers");
  if (!dense.is_array())
    throw InputError(f.file(), "mlp_only_layers", "must be a list of layer indices");
  for (size_t i = 0; i < dense.size(); ++i) {
    const std::string key = "mlp_only_layers[" + std::to_string(i) + "]";
    if (!dense[i].is_number_integer() || dense[i].get<int64_t>() < 0 ||
        dense[i].get<int64_t>() >= c->n_layers)
      throw InputError(
          f.file(), key,
          dense[i].dump() + " is not a layer index in [0, " + std::to_string(c->n_layers) + ")");
    m.sparse[dense[i].get<size_t>()] = false;
  }
}

void parse_llama_family(const Fields& f, ModelConfig* c) {
  const Architecture a = c->arch;
  c->vocab_size = f.integer("vocab_size");
  c->hidden_size = f.integer("hidden_size");
  c->intermediate_size = f.integer("intermediate_size");
  c->n_layers = f.integer("num_hidden_layers");
  c->n_heads = f.integer("num_attention_heads");
  const int64_t kv_default =
      a == Architecture::Llama || a == Architecture::Olmoe || a == Architecture::Phi3 ? c->n_heads
      : a == Architecture::Mistral || a == Architecture::Mixtral                      ? 8
      : a == Architecture::Qwen3Moe                                                   ? 4
                                                                                      : 32;
  c->n_kv_heads = f.integer_or("num_key_value_heads", kv_default);
  if (c->n_heads <= 0) throw InputError(f.file(), "num_attention_heads", "must be positive");
  // Qwen3's config defaults head_dim to 128; the others (Qwen3-MoE too) use
  // hidden_size / num_attention_heads.
  const int64_t hd_default = a == Architecture::Qwen3 ? 128 : c->hidden_size / c->n_heads;
  c->head_dim = f.integer_or("head_dim", hd_default);
  const int64_t ctx_default = a == Architecture::Llama                                   ? 2048
                              : a == Architecture::Mistral || a == Architecture::Mixtral ? 131072
                              : a == Architecture::Olmoe || a == Architecture::Phi3      ? 4096
                                                                                         : 32768;
  c->context_length = f.integer_or("max_position_embeddings", ctx_default);
  c->norm = NormKind::RmsNorm;
  c->norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c->mlp = MlpKind::SwiGlu;
  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu")
    throw InputError(f.file(), "hidden_act", "\"" + act + "\" is not supported (expected silu)");
  c->tied_embeddings = f.boolean_or("tie_word_embeddings", false);
  // Qwen2 hard-codes q/k/v biases; the others follow attention_bias.
  const bool attention_bias = f.boolean_or("attention_bias", false);
  c->qkv_bias = a == Architecture::Qwen2 || attention_bias;
  c->o_bias = a != Architecture::Qwen2 && attention_bias;
  c->mlp_bias = a == Architecture::Llama && f.boolean_or("mlp_bias", false);
  c->qk_norm = a == Architecture::Qwen3 || a == Architecture::Qwen3Moe || a == Architecture::Olmoe;
  if (a == Architecture::Olmoe) parse_olmoe_attention(f, c);
  // Before anything sized by them (one sliding window per layer below).
  c->check_limits(f.file());
  parse_rope(f, c);

  c->sliding_window.assign(static_cast<size_t>(c->n_layers), 0);
  if (a == Architecture::Mixtral || a == Architecture::Phi3) {
    c->sliding_window.assign(static_cast<size_t>(c->n_layers), f.integer_or("sliding_window", 0));
  } else if (a == Architecture::Qwen3Moe) {
    // One window on every layer when use_sliding_window (no max_window_layers).
    const bool use = f.boolean_or("use_sliding_window", false);
    c->sliding_window.assign(static_cast<size_t>(c->n_layers),
                             use ? f.integer_or("sliding_window", 4096) : 0);
  } else if (a == Architecture::Mistral) {
    // MistralConfig defaults to 4096 when the key is absent; null disables it.
    const int64_t w = !f.has_key("sliding_window") ? 4096 : f.integer_or("sliding_window", 0);
    c->sliding_window.assign(static_cast<size_t>(c->n_layers), w);
  } else if (a == Architecture::Qwen2 || a == Architecture::Qwen3) {
    const bool use = f.boolean_or("use_sliding_window", false);
    const int64_t w = use ? f.integer_or("sliding_window", 4096) : 0;
    if (f.present("layer_types") && w > 0) {
      const json& types = f.raw("layer_types");
      if (!types.is_array() || static_cast<int64_t>(types.size()) != c->n_layers)
        throw InputError(f.file(), "layer_types", "must list one type per layer");
      for (size_t i = 0; i < types.size(); ++i)
        if (types[i] == "sliding_attention") c->sliding_window[i] = w;
    } else if (w > 0) {
      // Layers from max_window_layers on use the window (a negative value: all).
      const int64_t first = std::max<int64_t>(0, f.integer_or("max_window_layers", 28));
      for (int64_t i = first; i < c->n_layers; ++i) c->sliding_window[static_cast<size_t>(i)] = w;
    }
  }
  if (a == Architecture::Mixtral || a == Architecture::Qwen3Moe || a == Architecture::Olmoe)
    parse_moe(f, c);
  c->bos_token_id =
      f.present("bos_token_id") ? token_id(f.raw("bos_token_id"), f.file(), "bos_token_id") : -1;
  if (f.present("eos_token_id"))
    c->eos_token_ids = token_ids(f.raw("eos_token_id"), f.file(), "eos_token_id");
}

void parse_gpt2(const Fields& f, ModelConfig* c) {
  c->vocab_size = f.integer_or("vocab_size", 50257);
  c->hidden_size = f.integer_or("n_embd", 768);
  c->n_layers = f.integer_or("n_layer", 12);
  c->n_heads = f.integer_or("n_head", 12);
  c->n_kv_heads = c->n_heads;
  if (c->n_heads <= 0 || c->hidden_size % c->n_heads != 0)
    throw InputError(f.file(), "n_head", "must divide n_embd=" + std::to_string(c->hidden_size));
  c->head_dim = c->hidden_size / c->n_heads;
  c->intermediate_size = f.integer_or("n_inner", 4 * c->hidden_size);
  c->context_length = f.integer_or("n_positions", 1024);
  c->norm = NormKind::LayerNorm;
  c->norm_eps = f.number_or("layer_norm_epsilon", 1e-5);
  c->mlp = MlpKind::GeluTanh;
  const std::string act = f.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw InputError(f.file(), "activation_function",
                     "\"" + act + "\" is not supported (expected gelu_new)");
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->learned_positions = true;
  c->tied_embeddings = true;
  c->rope.enabled = false;
  c->scale_attn_weights = f.boolean_or("scale_attn_weights", true);
  c->scale_attn_by_inverse_layer_idx = f.boolean_or("scale_attn_by_inverse_layer_idx", false);
  c->check_limits(f.file());
  c->sliding_window.assign(static_cast<size_t>(c->n_layers), 0);
  c->bos_token_id =
      f.present("bos_token_id") ? token_id(f.raw("bos_token_id"), f.file(), "bos_token_id") : 50256;
  c->eos_token_ids = f.present("eos_token_id")
                         ? token_ids(f.raw("eos_token_id"), f.file(), "eos_token_id")
                         : std::vector<int32_t>{50256};
}

}  // namespace

ModelConfig parse_hf_config(const std::string& path) {
  const json j = read_json(path);
  ModelConfig c;
  c.arch = architecture_of(j, path);
  c.source_format = "hf";
  Fields f(j, path);
  if (c.arch == Architecture::Gpt2)
    parse_gpt2(f, &c);
  else
    parse_llama_family(f, &c);
  c.validate(path);
  return c;
}

}  // namespace kvscope::model
