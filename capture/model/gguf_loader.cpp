#include "capture/model/gguf_loader.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "capture/model/mapped_tensor.h"
#include "capture/model/weight_builder.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace {

class GgufSource : public WeightSource {
 public:
  GgufSource(std::shared_ptr<const formats::GgufFile> f, bool interleaved)
      : f_(std::move(f)), interleaved_(interleaved) {}

  const std::string& file() const override { return f_->path(); }
  bool has(const std::string& name) const override { return f_->find_tensor(name) != nullptr; }
  std::string native_name(const std::string& name) const override { return name; }
  bool interleaved_qk() const override { return interleaved_; }

  torch::Tensor get(const std::string& name) override {
    const formats::GgufTensor* t = f_->find_tensor(name);
    if (!t) throw InputError(f_->path(), name, "tensor is missing");
    using formats::GgmlType;
    switch (static_cast<GgmlType>(t->type)) {
      case GgmlType::F32: return mapped_tensor(f_, f_->data(*t), t->shape(), torch::kFloat32);
      case GgmlType::F16: return mapped_tensor(f_, f_->data(*t), t->shape(), torch::kFloat16);
      case GgmlType::BF16: return mapped_tensor(f_, f_->data(*t), t->shape(), torch::kBFloat16);
      default: {
        // Quantised blocks: dequantised once into the tensor that is used.
        torch::Tensor out = torch::empty(t->shape(), torch::kFloat32);
        f_->dequantize(*t, out.data_ptr<float>());
        return out;
      }
    }
  }

 private:
  std::shared_ptr<const formats::GgufFile> f_;
  bool interleaved_;
};

// A size in [1, max] (ModelLimits), checked before anything it sizes exists.
int64_t positive_int(const formats::GgufFile& g, const std::string& key, int64_t max) {
  const formats::GgufValue* v = g.find(key);
  if (v && v->type == formats::GgufValueType::Array)
    throw InputError(g.path(), key, "per-layer arrays are not supported (expected one integer)");
  int64_t x = g.get_int(key);
  if (x <= 0) throw InputError(g.path(), key, "must be positive, got " + std::to_string(x));
  check_size(g.path(), key, x, 1, max);
  return x;
}

// Token ids: in [0, 2^31 - 1], never truncated to their low 32 bits.
std::vector<int32_t> special_ids(const formats::GgufFile& g,
                                 std::initializer_list<const char*> keys) {
  std::vector<int32_t> ids;
  for (const char* k : keys)
    if (g.has(k)) ids.push_back(static_cast<int32_t>(g.get_int_in(k, 0, INT32_MAX)));
  return ids;
}

// Phi-3's LongRoPE as llama.cpp's converter writes it: the factors as the
// tensors rope_factors_short / rope_factors_long, the trained length as
// rope.scaling.original_context_length, the attention factor as
// rope.scaling.attn_factor (absent: transformers' default from the lengths).
void gguf_longrope(const formats::GgufFile& g, const std::string& p, ModelConfig* c) {
  const formats::GgufTensor* s = g.find_tensor("rope_factors_short.weight");
  const formats::GgufTensor* l = g.find_tensor("rope_factors_long.weight");
  if (!s && !l) return;
  RopeConfig& r = c->rope;
  for (const formats::GgufTensor* t : {s, l})
    if (!t || t->elements() != r.dim / 2)
      throw InputError(
          g.path(),
          t ? t->name : std::string(s ? "rope_factors_long.weight" : "rope_factors_short.weight"),
          "LongRoPE needs rope_factors_short and rope_factors_long of rotary dim / 2 = " +
              std::to_string(r.dim / 2) + " entries");
  auto read = [&](const formats::GgufTensor& t) {
    std::vector<float> f(static_cast<size_t>(t.elements()));
    g.dequantize(t, f.data());
    return std::vector<double>(f.begin(), f.end());
  };
  r.scaling = RopeConfig::Scaling::LongRope;
  r.short_factor = read(*s);
  r.long_factor = read(*l);
  r.original_max_positions =
      positive_int(g, p + "rope.scaling.original_context_length", ModelLimits::kMaxContext);
  r.factor = double(c->context_length) / double(r.original_max_positions);
  r.attention_factor = g.get_float_or(
      p + "rope.scaling.attn_factor",
      r.factor <= 1.0
          ? 1.0
          : std::sqrt(1 + std::log(r.factor) / std::log(double(r.original_max_positions))));
}

// The experts, as llama.cpp reads them: expert_count and expert_used_count,
// the expert width in expert_feed_forward_length (Qwen3-MoE) or
// feed_forward_length, a layer routed when it has ffn_gate_inp. llama.cpp's
// graphs renormalise the top-k weights for llama (Mixtral) and qwen3moe, not
// for olmoe; expert_weights_norm, where written, says so explicitly.
void gguf_moe(const formats::GgufFile& g, const std::string& p, ModelConfig* c) {
  const bool moe_arch = c->arch == Architecture::Mixtral || c->arch == Architecture::Qwen3Moe ||
                        c->arch == Architecture::Olmoe;
  if (!moe_arch) return;
  MoeConfig& m = c->moe;
  m.n_experts = positive_int(g, p + "expert_count", ModelLimits::kMaxExperts);
  m.top_k = positive_int(g, p + "expert_used_count", m.n_experts);
  m.intermediate_size =
      g.has(p + "expert_feed_forward_length")
          ? positive_int(g, p + "expert_feed_forward_length", ModelLimits::kMaxIntermediate)
          : c->intermediate_size;
  m.normalize_top_k = g.get_bool_or(p + "expert_weights_norm", c->arch != Architecture::Olmoe);
  m.sparse.assign(static_cast<size_t>(c->n_layers), false);
  for (int64_t l = 0; l < c->n_layers; ++l)
    m.sparse[static_cast<size_t>(l)] =
        g.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight") != nullptr;
}

// The architecture a GGUF names, as KVScope runs it.
Architecture gguf_architecture(const formats::GgufFile& g, const std::string& arch) {
  static const std::map<std::string, Architecture> known = {
      {"llama", Architecture::Llama},       {"qwen2", Architecture::Qwen2},
      {"qwen3", Architecture::Qwen3},       {"gpt2", Architecture::Gpt2},
      {"qwen3moe", Architecture::Qwen3Moe}, {"olmoe", Architecture::Olmoe},
      {"phi3", Architecture::Phi3}};
  auto it = known.find(arch);
  if (it == known.end())
    throw InputError(g.path(), "general.architecture",
                     "unknown architecture \"" + arch +
                         "\" (KVScope runs llama (Mixtral too), qwen2, qwen3, qwen3moe, olmoe, "
                         "phi3 and gpt2 GGUFs)");
  return it->second;
}

// RoPE: base, dimensions, linear scaling, LongRoPE and llama.cpp's frequency factors.
void gguf_rope(const formats::GgufFile& g, const std::string& p, ModelConfig* config) {
  ModelConfig& c = *config;
  RopeConfig& r = c.rope;
  r.theta = g.get_float_or(p + "rope.freq_base", 10000.0);
  r.dim = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  const std::string type = g.get_string_or(p + "rope.scaling.type", "none");
  const double factor =
      g.get_float_or(p + "rope.scaling.factor", g.get_float_or(p + "rope.scale_linear", 1.0));
  if (type == "linear") {
    if (factor != 1.0) {
      r.scaling = RopeConfig::Scaling::Linear;
      r.factor = factor;
    }
  } else if (type != "none") {
    throw InputError(g.path(), p + "rope.scaling.type",
                     "RoPE scaling \"" + type + "\" is not supported (expected none or linear)");
  }
  gguf_longrope(g, p, &c);
  if (const formats::GgufTensor* f = g.find_tensor("rope_freqs.weight")) {
    if (f->elements() != r.dim / 2)
      throw InputError(g.path(), "rope_freqs.weight",
                       "has " + std::to_string(f->elements()) +
                           " entries, expected rope dimension/2 = " + std::to_string(r.dim / 2));
    r.freq_divisors.resize(static_cast<size_t>(f->elements()));
    g.dequantize(*f, r.freq_divisors.data());
  }
}

}  // namespace

ModelConfig gguf_model_config(const formats::GgufFile& g) {
  ModelConfig c;
  c.source_format = "gguf";
  const std::string arch = g.get_string("general.architecture");
  c.arch = gguf_architecture(g, arch);
  // llama.cpp's converter writes Mixtral as a llama with experts.
  if (arch == "llama" && g.get_int_or(arch + ".expert_count", 0) > 0)
    c.arch = Architecture::Mixtral;
  c.name = g.get_string_or("general.name", std::filesystem::path(g.path()).stem().string());
  const std::string p = arch + ".";
  using L = ModelLimits;
  c.hidden_size = positive_int(g, p + "embedding_length", L::kMaxHidden);
  c.n_layers = positive_int(g, p + "block_count", L::kMaxLayers);
  c.intermediate_size = positive_int(g, p + "feed_forward_length", L::kMaxIntermediate);
  c.n_heads = positive_int(g, p + "attention.head_count", L::kMaxHeads);
  c.n_kv_heads = g.has(p + "attention.head_count_kv")
                     ? positive_int(g, p + "attention.head_count_kv", L::kMaxHeads)
                     : c.n_heads;
  c.head_dim = g.has(p + "attention.key_length")
                   ? positive_int(g, p + "attention.key_length", L::kMaxHeadDim)
                   : c.hidden_size / c.n_heads;
  if (g.has(p + "attention.value_length") && g.get_int(p + "attention.value_length") != c.head_dim)
    throw InputError(g.path(), p + "attention.value_length", "must equal attention.key_length");
  c.context_length = positive_int(g, p + "context_length", L::kMaxContext);

  const formats::GgufTensor* embd = g.find_tensor("token_embd.weight");
  if (!embd || embd->ne.size() != 2)
    throw InputError(g.path(), "token_embd.weight", "missing or not 2-D");
  c.vocab_size = embd->ne[1];
  check_size(g.path(), "token_embd.weight", c.vocab_size, 1, L::kMaxVocab);
  c.tied_embeddings = g.find_tensor("output.weight") == nullptr;
  c.sliding_window.assign(static_cast<size_t>(c.n_layers),
                          g.get_int_or(p + "attention.sliding_window", 0));

  if (c.arch == Architecture::Gpt2) {
    c.norm = NormKind::LayerNorm;
    c.norm_eps = g.get_float(p + "attention.layer_norm_epsilon");
    c.mlp = MlpKind::GeluTanh;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.learned_positions = true;
    c.rope.enabled = false;
  } else {
    c.norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon");
    c.qkv_bias = c.arch == Architecture::Qwen2 || g.find_tensor("blk.0.attn_q.bias");
    c.o_bias = g.find_tensor("blk.0.attn_output.bias") != nullptr;
    c.mlp_bias = g.find_tensor("blk.0.ffn_gate.bias") != nullptr;
    c.qk_norm = c.arch == Architecture::Qwen3 || c.arch == Architecture::Qwen3Moe ||
                c.arch == Architecture::Olmoe;
    c.qk_norm_whole = c.arch == Architecture::Olmoe;
    c.clip_qkv = g.get_float_or(p + "attention.clamp_kqv", 0.0);
    gguf_moe(g, p, &c);
    gguf_rope(g, p, &c);
  }
  std::vector<int32_t> bos = special_ids(g, {"tokenizer.ggml.bos_token_id"});
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = special_ids(g, {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                    "tokenizer.ggml.eom_token_id"});
  c.validate(g.path());
  return c;
}

std::unique_ptr<Transformer> load_gguf_model(const std::string& path,
                                             const torch::TensorOptions& target) {
  auto gguf = std::make_shared<formats::GgufFile>(path);
  // Fail before any work when a tensor has a type we cannot dequantise.
  for (const formats::GgufTensor& t : gguf->tensors())
    if (!formats::ggml_type_supported(t.type))
      throw InputError(
          path, t.name,
          std::string("tensor type ") + formats::ggml_type_name(t.type) +
              " is not supported (KVScope dequantises F32, F16, BF16, Q8_0, Q4_0, Q4_1)");
  ModelConfig config = gguf_model_config(*gguf);
  GgufSource source(gguf,
                    config.arch == Architecture::Llama || config.arch == Architecture::Mixtral);
  ModelWeights weights = build_weights(config, source, target);
  return std::make_unique<Transformer>(std::move(config), std::move(weights));
}

}  // namespace kvscope::model
