#include "capture/model/model_config.h"

#include <cmath>
#include <sstream>

#include "core/common/input_error.h"

namespace kvscope::model {

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Llama: return "llama";
    case Architecture::Mistral: return "mistral";
    case Architecture::Qwen2: return "qwen2";
    case Architecture::Qwen3: return "qwen3";
    case Architecture::Gpt2: return "gpt2";
    case Architecture::Mixtral: return "mixtral";
    case Architecture::Qwen3Moe: return "qwen3_moe";
    case Architecture::Olmoe: return "olmoe";
    case Architecture::Phi3: return "phi3";
  }
  return "?";
}

const char* rope_scaling_name(RopeConfig::Scaling s) {
  switch (s) {
    case RopeConfig::Scaling::None: return "none";
    case RopeConfig::Scaling::Linear: return "linear";
    case RopeConfig::Scaling::Dynamic: return "dynamic";
    case RopeConfig::Scaling::Llama3: return "llama3";
    case RopeConfig::Scaling::LongRope: return "longrope";
  }
  return "?";
}

void check_size(const std::string& file, const std::string& field, int64_t value, int64_t lo,
                int64_t hi) {
  if (value < lo || value > hi)
    throw InputError(file, field,
                     std::to_string(value) + " is outside [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]" +
                         (value > hi ? " (the limit of what KVScope loads)" : ""));
}

void ModelConfig::check_limits(const std::string& file) const {
  using L = ModelLimits;
  check_size(file, "num_hidden_layers", n_layers, 1, L::kMaxLayers);
  check_size(file, "num_attention_heads", n_heads, 1, L::kMaxHeads);
  check_size(file, "num_key_value_heads", n_kv_heads, 1, L::kMaxHeads);
  check_size(file, "head_dim", head_dim, 1, L::kMaxHeadDim);
  check_size(file, "hidden_size", hidden_size, 1, L::kMaxHidden);
  check_size(file, "intermediate_size", intermediate_size, 1, L::kMaxIntermediate);
  check_size(file, "vocab_size", vocab_size, 1, L::kMaxVocab);
  check_size(file, "max_position_embeddings", context_length, 1, L::kMaxContext);
  if (moe.n_experts > 0) {
    check_size(file, "num_experts", moe.n_experts, 1, L::kMaxExperts);
    check_size(file, "num_experts_per_tok", moe.top_k, 1, moe.n_experts);
    check_size(file, "moe_intermediate_size", moe.intermediate_size, 1, L::kMaxIntermediate);
  }
}

double ModelConfig::parameter_estimate() const {
  const double D = double(hidden_size), F = double(intermediate_size), V = double(vocab_size);
  const double q = double(n_heads) * double(head_dim), kv = double(n_kv_heads) * double(head_dim);
  const double attention = D * (q + 2 * kv) + q * D;
  const double dense_ffn = (mlp == MlpKind::SwiGlu ? 3.0 : 2.0) * D * F;
  const double moe_ffn = double(moe.n_experts) * (3.0 * D * double(moe.intermediate_size) + D);
  double layers = 0;
  for (int64_t l = 0; l < n_layers; ++l)
    layers += attention + (moe_layer(l) ? moe_ffn : dense_ffn) + 2 * D;
  return V * D * (tied_embeddings ? 1 : 2) + (learned_positions ? double(context_length) * D : 0) +
         layers + D;
}

double ModelConfig::attention_scale(int64_t layer) const {
  double s = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
  if (scale_attn_by_inverse_layer_idx) s /= static_cast<double>(layer + 1);
  return s;
}

void ModelConfig::validate(const std::string& file) const {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) throw InputError(file, field, "must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", n_layers);
  positive("num_attention_heads", n_heads);
  positive("num_key_value_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", context_length);
  check_limits(file);
  if (n_heads % n_kv_heads != 0)
    throw InputError(file, "num_key_value_heads",
                     std::to_string(n_kv_heads) +
                         " does not divide num_attention_heads=" + std::to_string(n_heads));
  if (rope.enabled) {
    if (head_dim % 2 != 0)
      throw InputError(file, "head_dim",
                       "RoPE needs an even head_dim, got " + std::to_string(head_dim));
    if (rope.dim != head_dim)
      throw InputError(file, "rope dimension",
                       "partial rotary embeddings are not supported (rotary dim " +
                           std::to_string(rope.dim) + ", head_dim " + std::to_string(head_dim) +
                           ")");
    if (!(rope.theta > 0)) throw InputError(file, "rope_theta", "must be positive");
    if (rope.scaling != RopeConfig::Scaling::None && !(rope.factor > 0))
      throw InputError(file, "rope_scaling.factor", "must be positive");
    if (rope.scaling == RopeConfig::Scaling::LongRope &&
        (static_cast<int64_t>(rope.short_factor.size()) != rope.dim / 2 ||
         static_cast<int64_t>(rope.long_factor.size()) != rope.dim / 2))
      throw InputError(file, "rope_scaling.short_factor",
                       "longrope needs rotary dim / 2 = " + std::to_string(rope.dim / 2) +
                           " short and long factors");
    if ((rope.scaling == RopeConfig::Scaling::Llama3 ||
         rope.scaling == RopeConfig::Scaling::Dynamic ||
         rope.scaling == RopeConfig::Scaling::LongRope) &&
        rope.original_max_positions <= 0)
      throw InputError(file, "rope_scaling.original_max_position_embeddings", "must be positive");
    if (rope.scaling == RopeConfig::Scaling::Llama3 &&
        !(rope.high_freq_factor > rope.low_freq_factor))
      throw InputError(file, "rope_scaling.high_freq_factor", "must exceed low_freq_factor");
    if (!rope.freq_divisors.empty() &&
        static_cast<int64_t>(rope.freq_divisors.size()) != head_dim / 2)
      throw InputError(file, "rope_freqs.weight",
                       "has " + std::to_string(rope.freq_divisors.size()) +
                           " entries, expected head_dim/2 = " + std::to_string(head_dim / 2));
  }
  if (static_cast<int64_t>(sliding_window.size()) != n_layers)
    throw InputError(file, "sliding_window", "internal: one entry per layer expected");
  if (!(norm_eps > 0)) throw InputError(file, "norm epsilon", "must be positive");
  if (!(clip_qkv >= 0)) throw InputError(file, "clip_qkv", "must be positive or null");
  if (moe.n_experts > 0 && static_cast<int64_t>(moe.sparse.size()) != n_layers)
    throw InputError(file, "mlp_only_layers", "internal: one MoE flag per layer expected");
}

std::string ModelConfig::describe() const {
  std::ostringstream o;
  o << "architecture   " << architecture_name(arch) << " (from " << source_format << ")\n";
  o << "layers         " << n_layers << "\n";
  o << "hidden size    " << hidden_size << ", MLP " << intermediate_size << " ("
    << (mlp == MlpKind::SwiGlu ? "SwiGLU" : "GELU tanh") << ")\n";
  if (moe.n_experts > 0) {
    int64_t sparse = 0;
    for (int64_t l = 0; l < n_layers; ++l) sparse += moe_layer(l);
    o << "experts        " << moe.n_experts << " x SwiGLU " << moe.intermediate_size << ", top "
      << moe.top_k << (moe.normalize_top_k ? " (renormalised)" : "") << ", on " << sparse << " of "
      << n_layers << " layers\n";
  }
  o << "attention      " << n_heads << " heads, " << n_kv_heads << " kv heads, head_dim "
    << head_dim
    << (qk_norm ? (qk_norm_whole ? ", q/k RMSNorm over all heads" : ", q/k RMSNorm") : "")
    << (qkv_bias ? ", qkv bias" : "");
  if (clip_qkv > 0) o << ", q/k/v clipped to +-" << clip_qkv;
  o << "\n";
  o << "norm           " << (norm == NormKind::RmsNorm ? "RMSNorm" : "LayerNorm") << " eps "
    << norm_eps << "\n";
  if (rope.enabled) {
    o << "positions      RoPE theta " << rope.theta << ", scaling "
      << rope_scaling_name(rope.scaling);
    if (rope.scaling != RopeConfig::Scaling::None) o << " x" << rope.factor;
    if (rope.scaling == RopeConfig::Scaling::LongRope)
      o << " (long factors past " << rope.original_max_positions << ", attention factor "
        << rope.attention_factor << ")";
    if (!rope.freq_divisors.empty()) o << " (rope_freqs tensor)";
    o << "\n";
  } else {
    o << "positions      learned (" << context_length << ")\n";
  }
  int64_t windowed = 0, window = 0;
  for (int64_t w : sliding_window)
    if (w > 0) ++windowed, window = w;
  if (windowed)
    o << "sliding window " << window << " on " << windowed << " of " << n_layers << " layers\n";
  o << "vocabulary     " << vocab_size << (tied_embeddings ? " (tied embeddings)" : "") << "\n";
  o << "context length " << context_length << "\n";
  return o.str();
}

}  // namespace kvscope::model
