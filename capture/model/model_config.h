// What the forward pass needs to know about a model, whatever file it came
// from. The loaders (HF directory, GGUF, llama2.c) fill it; the per-
// architecture differences of formats.md §2.3 are reduced to a few switches
// (norm kind, MLP kind, biases, q/k norm, learned positions, RoPE, a sparse
// mixture of experts in place of the MLP).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::model {

enum class Architecture { Llama, Mistral, Qwen2, Qwen3, Gpt2, Mixtral, Qwen3Moe, Olmoe, Phi3 };

// Bounds of the sizes a model file may declare. Every loader checks the
// sizes it reads against them before it allocates anything they size: a
// config.json saying 10^9 layers is refused, not grown to gigabytes. They are
// far above any model KVScope runs (Llama 3.1 405B: 126 layers, 128 heads,
// hidden 16384, MLP 53248, vocabulary 128256) and far below where size
// arithmetic overflows; layers and heads match the trace reader's limits.
struct ModelLimits {
  static constexpr int64_t kMaxLayers = 4096;
  static constexpr int64_t kMaxHeads = 4096;
  static constexpr int64_t kMaxHeadDim = 16384;
  static constexpr int64_t kMaxHidden = int64_t(1) << 20;
  static constexpr int64_t kMaxIntermediate = int64_t(1) << 22;
  static constexpr int64_t kMaxVocab = int64_t(1) << 24;
  static constexpr int64_t kMaxContext = int64_t(1) << 26;  // the trace's token axis
  static constexpr int64_t kMaxExperts = 4096;              // DeepSeek-V3: 256 routed experts
};

// Throws InputError(file, field, ...) naming the value and the range unless
// lo <= value <= hi.
void check_size(const std::string& file, const std::string& field, int64_t value, int64_t lo,
                int64_t hi);
const char* architecture_name(Architecture a);

enum class NormKind { RmsNorm, LayerNorm };
enum class MlpKind { SwiGlu, GeluTanh };

// RoPE frequencies (formats.md §2.2). Weights are always brought into the HF
// "rotate-half" row order at load, so one rotation serves every source.
struct RopeConfig {
  enum class Scaling { None, Linear, Dynamic, Llama3, LongRope };
  bool enabled = true;
  double theta = 10000.0;
  int64_t dim = 0;  // rotary dimension (= head_dim)
  Scaling scaling = Scaling::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_positions =
      0;  // llama3, longrope: original_max_position_embeddings; dynamic: M
  // LongRoPE (Phi-3): per-frequency divisors of the base frequencies, the
  // short ones while a sequence fits original_max_positions, the long ones
  // past it; cos and sin are scaled by attention_factor.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  // GGUF rope_freqs.weight: per-frequency divisors (llama3 scaling baked in).
  std::vector<float> freq_divisors;
};
const char* rope_scaling_name(RopeConfig::Scaling s);

// A sparse mixture of experts in place of the dense MLP (Mixtral, Qwen3-MoE,
// OLMoE): per token a linear router scores n_experts SwiGLU experts, the
// softmax (float32) of its logits is cut to the top_k, optionally renormalised
// to sum to 1, and the chosen experts' outputs are summed with those weights.
// Attention and the KV cache are those of the dense model.
struct MoeConfig {
  int64_t n_experts = 0;  // 0: no MoE layers
  int64_t top_k = 0;
  int64_t intermediate_size = 0;  // each expert's hidden width
  bool normalize_top_k = false;   // divide the top_k weights by their sum
  std::vector<bool> sparse;       // per layer: experts (true) or the dense MLP
};

struct ModelConfig {
  Architecture arch = Architecture::Llama;
  std::string source_format;  // "hf", "gguf", "llama2.c"
  std::string name;           // a display name (file or general.name)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t context_length = 0;  // trained context (max_position_embeddings)

  NormKind norm = NormKind::RmsNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::SwiGlu;
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;            // Qwen3: per-head RMSNorm on q and k before RoPE
  bool qk_norm_whole = false;      // OLMoE: the q/k RMSNorm spans all heads' rows at once
  double clip_qkv = 0;             // OLMoE clip_qkv: q, k, v clamped to [-c, c] (0: none)
  bool learned_positions = false;  // GPT-2 wpe
  bool tied_embeddings = false;
  RopeConfig rope;
  MoeConfig moe;

  // Softmax scale = attn_scale / sqrt(head_dim) (GPT-2 options fold in here).
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // Per-layer sliding window (0 = full attention); size n_layers.
  std::vector<int64_t> sliding_window;

  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  bool moe_layer(int64_t layer) const {
    return moe.n_experts > 0 && moe.sparse[static_cast<size_t>(layer)];
  }
  // Checks every size against ModelLimits (HF field names); the loaders
  // call it, or check_size with their own names, before allocating.
  void check_limits(const std::string& file) const;
  // Parameters the config describes (embeddings, attention, MLP, norms), in
  // double: a hostile config can describe more than int64 counts.
  double parameter_estimate() const;
  double attention_scale(int64_t layer) const;
  // Checks the numbers are coherent (positive, heads divisible, ...); throws
  // InputError naming `file` and the offending field.
  void validate(const std::string& file) const;
  std::string describe() const;  // one line per fact, for model-info
};

}  // namespace kvscope::model
