#include "capture/model/weight_builder.h"

#include <cstdio>

#include <torch/torch.h>

#include <sstream>

#include "core/common/input_error.h"
#include "core/common/memory_limit.h"

namespace kvscope::model {

namespace {

std::string shape_str(torch::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

class Builder {
 public:
  Builder(const ModelConfig& c, WeightSource& s, const torch::TensorOptions& t)
      : c_(c), src_(s), target_(t) {}

  // A required tensor of the given shape; `why` says which config fields
  // imply the shape, so a mismatch message points at the disagreement.
  torch::Tensor need(const std::string& name, std::vector<int64_t> shape, const std::string& why) {
    if (!src_.has(name))
      throw InputError(src_.file(), src_.native_name(name),
                       "tensor is missing (expected shape " + shape_str(shape) + ": " + why + ")");
    return checked(name, std::move(shape), why);
  }
  torch::Tensor maybe(const std::string& name, std::vector<int64_t> shape, const std::string& why) {
    return src_.has(name) ? checked(name, std::move(shape), why) : torch::Tensor();
  }
  // A Conv1D weight (GPT-2): stored [in, out] in HF files, [out, in] in GGUF.
  torch::Tensor need_linear(const std::string& name, int64_t out, int64_t in,
                            const std::string& why) {
    if (!src_.conv1d_layout()) return need(name, {out, in}, why);
    return need(name, {in, out}, why + ", Conv1D [in, out] layout").t().contiguous();
  }

  torch::Tensor to_target(const torch::Tensor& t) const {
    return t.defined() ? t.to(target_.device(), target_.dtype()) : t;
  }

 private:
  torch::Tensor checked(const std::string& name, std::vector<int64_t> shape,
                        const std::string& why) {
    torch::Tensor t = src_.get(name);
    if (t.sizes() != torch::IntArrayRef(shape))
      throw InputError(src_.file(), src_.native_name(name),
                       "shape " + shape_str(t.sizes()) + " disagrees with the config: expected " +
                           shape_str(shape) + " (" + why + ")");
    return t;
  }

  const ModelConfig& c_;
  WeightSource& src_;
  torch::TensorOptions target_;
};

std::string fields(const char* a, int64_t va) {
  return std::string(a) + "=" + std::to_string(va);
}
std::string fields(const char* a, int64_t va, const char* b, int64_t vb) {
  return fields(a, va) + ", " + fields(b, vb);
}

void build_attention(const ModelConfig& c, WeightSource& src, Builder& b, int64_t l,
                     LayerWeights* w) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size, hd = c.head_dim;
  const std::string qwhy = "num_attention_heads=" + std::to_string(c.n_heads) +
                           " x head_dim=" + std::to_string(hd) + ", " + fields("hidden_size", D);
  const std::string kwhy = "num_key_value_heads=" + std::to_string(c.n_kv_heads) +
                           " x head_dim=" + std::to_string(hd) + ", " + fields("hidden_size", D);
  if (c.arch == Architecture::Gpt2) {
    w->wqkv = b.need_linear(p + "attn_qkv.weight", 3 * D, D, "3 x n_embd, n_embd");
    w->bqkv = b.need(p + "attn_qkv.bias", {3 * D}, "3 x n_embd");
    w->wo = b.need_linear(p + "attn_output.weight", D, D, "n_embd, n_embd");
    w->bo = b.need(p + "attn_output.bias", {D}, "n_embd");
    return;
  }
  if (c.arch == Architecture::Phi3) {
    // Phi-3 stores q, k and v fused already (qkv_proj), in this order.
    w->wqkv = b.need(p + "attn_qkv.weight", {c.q_dim() + 2 * c.kv_dim(), D}, qwhy + "; " + kwhy)
                  .to(torch::kFloat32);
    w->wo =
        b.need(p + "attn_output.weight", {D, c.q_dim()}, fields("hidden_size", D) + "; " + qwhy);
    return;
  }
  torch::Tensor wq = b.need(p + "attn_q.weight", {c.q_dim(), D}, qwhy);
  torch::Tensor wk = b.need(p + "attn_k.weight", {c.kv_dim(), D}, kwhy);
  torch::Tensor wv = b.need(p + "attn_v.weight", {c.kv_dim(), D}, kwhy);
  torch::Tensor bq, bk, bv;
  if (c.qkv_bias) {
    bq = b.need(p + "attn_q.bias", {c.q_dim()}, qwhy);
    bk = b.need(p + "attn_k.bias", {c.kv_dim()}, kwhy);
    bv = b.need(p + "attn_v.bias", {c.kv_dim()}, kwhy);
  }
  if (src.interleaved_qk()) {
    wq = interleaved_to_rotate_half(wq, c.n_heads, hd);
    wk = interleaved_to_rotate_half(wk, c.n_kv_heads, hd);
    if (bq.defined()) bq = interleaved_to_rotate_half(bq, c.n_heads, hd);
    if (bk.defined()) bk = interleaved_to_rotate_half(bk, c.n_kv_heads, hd);
  }
  w->wqkv = torch::cat({wq.to(torch::kFloat32), wk.to(torch::kFloat32), wv.to(torch::kFloat32)});
  if (c.qkv_bias)
    w->bqkv = torch::cat({bq.to(torch::kFloat32), bk.to(torch::kFloat32), bv.to(torch::kFloat32)});
  if (c.qk_norm && c.qk_norm_whole) {
    w->q_norm = b.need(p + "attn_q_norm.weight", {c.q_dim()}, qwhy + " (one norm over all heads)");
    w->k_norm = b.need(p + "attn_k_norm.weight", {c.kv_dim()}, kwhy + " (one norm over all heads)");
  } else if (c.qk_norm) {
    w->q_norm = b.need(p + "attn_q_norm.weight", {hd}, fields("head_dim", hd));
    w->k_norm = b.need(p + "attn_k_norm.weight", {hd}, fields("head_dim", hd));
  }
  w->wo = b.need(p + "attn_output.weight", {D, c.q_dim()}, fields("hidden_size", D) + "; " + qwhy);
  if (c.o_bias) w->bo = b.need(p + "attn_output.bias", {D}, fields("hidden_size", D));
}

// One of an MoE layer's expert tensors, all experts stacked [E, rows, cols]:
// GGUF stores them so (blk.N.ffn_gate_exps.weight), HF checkpoints one per
// expert (canonical blk.N.ffn_gate_exps.E.weight, stacked here).
torch::Tensor expert_stack(const ModelConfig& c, WeightSource& src, Builder& b,
                           const std::string& stem, int64_t rows, int64_t cols,
                           const std::string& why) {
  const int64_t E = c.moe.n_experts;
  if (src.has(stem + ".weight"))
    return b.need(stem + ".weight", {E, rows, cols}, fields("num_experts", E) + ", " + why)
        .to(torch::kFloat32);
  std::vector<torch::Tensor> per;
  per.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    per.push_back(
        b.need(stem + "." + std::to_string(e) + ".weight", {rows, cols}, why).to(torch::kFloat32));
  return torch::stack(per);
}

void build_moe(const ModelConfig& c, WeightSource& src, Builder& b, int64_t l, LayerWeights* w) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size, I = c.moe.intermediate_size, E = c.moe.n_experts;
  const std::string why = fields("moe_intermediate_size", I, "hidden_size", D);
  w->router = b.need(p + "ffn_gate_inp.weight", {E, D}, fields("num_experts", E, "hidden_size", D));
  torch::Tensor gate = expert_stack(c, src, b, p + "ffn_gate_exps", I, D, why);
  torch::Tensor up = expert_stack(c, src, b, p + "ffn_up_exps", I, D, why);
  w->experts_up = torch::cat({gate, up}, 1);
  w->experts_down = expert_stack(c, src, b, p + "ffn_down_exps", D, I, why);
}

void build_mlp(const ModelConfig& c, WeightSource& src, Builder& b, int64_t l, LayerWeights* w) {
  if (c.moe_layer(l)) return build_moe(c, src, b, l, w);
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size, I = c.intermediate_size;
  const std::string why = fields("intermediate_size", I, "hidden_size", D);
  if (c.mlp == MlpKind::GeluTanh) {
    w->w_up = b.need_linear(p + "ffn_up.weight", I, D, why);
    w->b_up = b.need(p + "ffn_up.bias", {I}, why);
    w->w_down = b.need_linear(p + "ffn_down.weight", D, I, why);
    w->b_down = b.need(p + "ffn_down.bias", {D}, why);
    return;
  }
  if (c.arch == Architecture::Phi3) {
    // gate_up_proj: the gate rows, then the up rows (the fused layout here).
    w->w_up = b.need(p + "ffn_up.weight", {2 * I, D}, "2 x " + why);
    w->w_down = b.need(p + "ffn_down.weight", {D, I}, why);
    return;
  }
  torch::Tensor gate = b.need(p + "ffn_gate.weight", {I, D}, why);
  torch::Tensor up = b.need(p + "ffn_up.weight", {I, D}, why);
  w->w_up = torch::cat({gate.to(torch::kFloat32), up.to(torch::kFloat32)});
  if (c.mlp_bias) {
    torch::Tensor bg = b.need(p + "ffn_gate.bias", {I}, why);
    torch::Tensor bu = b.need(p + "ffn_up.bias", {I}, why);
    w->b_up = torch::cat({bg.to(torch::kFloat32), bu.to(torch::kFloat32)});
  }
  w->w_down = b.need(p + "ffn_down.weight", {D, I}, why);
  if (c.mlp_bias) w->b_down = b.need(p + "ffn_down.bias", {D}, why);
}

void build_norms(const ModelConfig& c, Builder& b, int64_t l, LayerWeights* w) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size;
  const std::string why = fields("hidden_size", D);
  w->attn_norm = b.need(p + "attn_norm.weight", {D}, why);
  w->ffn_norm = b.need(p + "ffn_norm.weight", {D}, why);
  if (c.norm == NormKind::LayerNorm) {
    w->attn_norm_bias = b.need(p + "attn_norm.bias", {D}, why);
    w->ffn_norm_bias = b.need(p + "ffn_norm.bias", {D}, why);
  }
}

void to_target(Builder& b, LayerWeights* w) {
  for (torch::Tensor* t : layer_slots(*w)) *t = b.to_target(*t);
}

}  // namespace

torch::Tensor interleaved_to_rotate_half(const torch::Tensor& w, int64_t n_heads,
                                         int64_t head_dim) {
  std::vector<int64_t> rest(w.sizes().begin() + 1, w.sizes().end());
  std::vector<int64_t> split = {n_heads, head_dim / 2, 2};
  split.insert(split.end(), rest.begin(), rest.end());
  // [H, d/2, 2, ...] -> [H, 2, d/2, ...]: the even (real) rows first, then the odd.
  return w.reshape(split).transpose(1, 2).reshape(w.sizes()).contiguous();
}

namespace {

// The weights in the target dtype must fit in this machine's memory: a
// config that describes more is refused with both numbers before the first
// tensor is built, not found out by the OOM killer halfway through.
void check_fits_in_memory(const ModelConfig& c, const torch::TensorOptions& target,
                          const std::string& file) {
  const double bytes = c.parameter_estimate() *
                       double(torch::elementSize(torch::typeMetaToScalarType(target.dtype())));
  const double memory = double(physical_memory_bytes());
  if (memory > 0 && bytes > memory) {
    char what[256];
    std::snprintf(what, sizeof what,
                  "describes %.3g parameters, %.1f GiB of weights as %s; this machine has "
                  "%.1f GiB of memory",
                  c.parameter_estimate(), bytes / double(1 << 30),
                  c10::toString(torch::typeMetaToScalarType(target.dtype())),
                  memory / double(1 << 30));
    throw InputError(file, "config", what);
  }
}

}  // namespace

ModelWeights build_weights(const ModelConfig& c, WeightSource& src,
                           const torch::TensorOptions& target) {
  check_fits_in_memory(c, target, src.file());
  Builder b(c, src, target);
  ModelWeights m;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  m.embed =
      b.to_target(b.need("token_embd.weight", {V, D}, fields("vocab_size", V, "hidden_size", D)));
  if (c.learned_positions)
    m.pos_embed = b.to_target(b.need("position_embd.weight", {c.context_length, D},
                                     fields("n_positions", c.context_length, "n_embd", D)));
  m.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = m.layers[static_cast<size_t>(l)];
    build_norms(c, b, l, &w);
    build_attention(c, src, b, l, &w);
    build_mlp(c, src, b, l, &w);
    to_target(b, &w);
  }
  m.final_norm = b.to_target(b.need("output_norm.weight", {D}, fields("hidden_size", D)));
  if (c.norm == NormKind::LayerNorm)
    m.final_norm_bias = b.to_target(b.need("output_norm.bias", {D}, fields("hidden_size", D)));
  if (c.tied_embeddings || !src.has("output.weight")) {
    if (!c.tied_embeddings && c.source_format == "hf")
      throw InputError(src.file(), src.native_name("output.weight"),
                       "tensor is missing and tie_word_embeddings is false");
    m.lm_head = m.embed;
  } else {
    m.lm_head =
        b.to_target(b.need("output.weight", {V, D}, fields("vocab_size", V, "hidden_size", D)));
  }
  return m;
}

}  // namespace kvscope::model
