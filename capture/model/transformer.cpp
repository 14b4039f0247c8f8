#include "capture/model/transformer.h"

#include <torch/torch.h>

#include <unordered_set>

#include "capture/model/cpu_ops.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace {

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (x.size(0) == 1 && (w.scalar_type() == torch::kFloat32 || !w.device().is_cpu())) {
    // One row (a decode step): GEMV streams the weight once, while BLAS GEMM
    // with m = 1 packs it first (OpenBLAS 0.3.21: 3-4x slower, measured).
    // Not for bf16/fp16 on the CPU: LibTorch 1.13's mv/addmv there
    // accumulates in the reduced type (bf16, 576 inputs: 5.2 max error against
    // 0.19 for one rounding of the exact product); its mm accumulates in
    // float32.
    const torch::Tensor v = x.select(0, 0);
    return (b.defined() ? torch::addmv(b, w, v) : torch::mv(w, v)).unsqueeze(0);
  }
  return b.defined() ? torch::addmm(b, x, w.t()) : torch::mm(x, w.t());
}

// RMSNorm over the last dimension as transformers computes it: normalise in
// float32, cast back, then scale.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor inv = torch::rsqrt(xf.square().mean(-1, /*keepdim=*/true) + eps);
  return w * (xf * inv).to(x.scalar_type());
}

}  // namespace

Transformer::Transformer(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      rope_(config_.rope, weights_.embed.device()) {}

int64_t Transformer::parameter_count() const {
  int64_t n = 0;
  std::unordered_set<const void*> seen;
  auto add = [&](const torch::Tensor& t) {
    if (t.defined() && seen.insert(t.data_ptr()).second) n += t.numel();
  };
  add(weights_.embed);
  add(weights_.pos_embed);
  for (const LayerWeights& w : weights_.layers)
    for (const torch::Tensor* t : layer_slots(w)) add(*t);
  add(weights_.final_norm);
  add(weights_.final_norm_bias);
  add(weights_.lm_head);
  return n;
}

int64_t Transformer::weight_bytes() const {
  return parameter_count() * static_cast<int64_t>(torch::elementSize(dtype()));
}

torch::Tensor Transformer::embed(const torch::Tensor& tokens, int64_t pos0) const {
  const int64_t n = tokens.size(0);
  if (tokens.dim() != 1 || n == 0)
    throw InputError("", "tokens", "forward needs a non-empty 1-D tensor of token ids");
  const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
  if (lo < 0 || hi >= config_.vocab_size)
    throw InputError("", "tokens",
                     "token id " + std::to_string(lo < 0 ? lo : hi) +
                         " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) +
                         ")");
  torch::Tensor x = weights_.embed.index_select(0, tokens.to(device()));
  if (config_.learned_positions) {
    if (pos0 + n > config_.context_length)
      throw InputError("", "positions",
                       "position " + std::to_string(pos0 + n - 1) +
                           " is past the learned position table (n_positions=" +
                           std::to_string(config_.context_length) + ")");
    x = x + weights_.pos_embed.narrow(0, pos0, n);
  }
  return x;
}

torch::Tensor Transformer::norm(const torch::Tensor& x, const torch::Tensor& w,
                                const torch::Tensor& b) const {
  if (config_.norm == NormKind::LayerNorm)
    return torch::layer_norm(x, {x.size(-1)}, w, b, config_.norm_eps);
  if (cpu_ops::eligible(x)) return cpu_ops::rms_norm(x, w, config_.norm_eps);
  return rms_norm(x, w, config_.norm_eps);
}

torch::Tensor Transformer::attention_block(const torch::Tensor& h, int64_t layer, int64_t pos0,
                                           const torch::Tensor& cos, const torch::Tensor& sin,
                                           AttentionBackend& backend) const {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int64_t n = h.size(0), H = config_.n_heads, K = config_.n_kv_heads, hd = config_.head_dim;
  torch::Tensor qkv = linear(h, w.wqkv, w.bqkv);
  torch::Tensor q = qkv.narrow(1, 0, H * hd).view({n, H, hd});
  torch::Tensor k = qkv.narrow(1, H * hd, K * hd).view({n, K, hd});
  torch::Tensor v = qkv.narrow(1, (H + K) * hd, K * hd).view({n, K, hd});
  AttentionInputs in;
  in.layer = layer;
  in.pos0 = pos0;
  in.hidden = h;
  in.v = v;
  if (config_.rope.enabled && !config_.qk_norm && config_.clip_qkv == 0 && cpu_ops::eligible(qkv)) {
    // Fast path: rotate q and k in place in the fresh qkv buffer, after
    // keeping a copy of k before the rotation.
    in.k_pre_rope = k.clone();
    const torch::Tensor c = cos.contiguous(), s = sin.contiguous();
    cpu_ops::rope_inplace(qkv.data_ptr<float>(), n, qkv.size(1), H + K, hd, c.data_ptr<float>(),
                          s.data_ptr<float>());
    in.q = q;
    in.k = k;
  } else {
    if (config_.qk_norm && config_.qk_norm_whole) {
      q = rms_norm(q.reshape({n, H * hd}), w.q_norm, config_.norm_eps).view({n, H, hd});
      k = rms_norm(k.reshape({n, K * hd}), w.k_norm, config_.norm_eps).view({n, K, hd});
    } else if (config_.qk_norm) {
      q = rms_norm(q, w.q_norm, config_.norm_eps);
      k = rms_norm(k, w.k_norm, config_.norm_eps);
    }
    if (config_.clip_qkv > 0) {
      const double c = config_.clip_qkv;
      q = q.clamp(-c, c);
      k = k.clamp(-c, c);
      in.v = v.clamp(-c, c);
    }
    in.k_pre_rope = k;
    in.q = config_.rope.enabled ? Rope::apply(q, cos, sin) : q;
    in.k = config_.rope.enabled ? Rope::apply(k, cos, sin) : k;
  }
  in.scale = config_.attention_scale(layer);
  in.sliding_window = config_.sliding_window[static_cast<size_t>(layer)];
  torch::Tensor out = backend.attend(in);
  return linear(out.reshape({n, H * hd}), w.wo, w.bo);
}

torch::Tensor Transformer::mlp_block(const torch::Tensor& h, int64_t layer) const {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  if (config_.moe_layer(layer)) return moe_block(h, w);
  torch::Tensor up = linear(h, w.w_up, w.b_up);
  torch::Tensor m;
  if (config_.mlp == MlpKind::SwiGlu) {
    const int64_t I = config_.intermediate_size;
    // The fused loop wins for a few rows; LibTorch's vectorised, threaded
    // silu wins for a prefill chunk.
    if (up.size(0) <= 8 && cpu_ops::eligible(up))
      m = cpu_ops::swiglu(up, I);
    else
      m = torch::silu(up.narrow(1, 0, I)) * up.narrow(1, I, I);
  } else {
    m = torch::gelu(up, "tanh");
  }
  return linear(m, w.w_down, w.b_down);
}

// As transformers computes it: the router's logits in the model's dtype, their
// softmax in float32, the top_k (renormalised when the config says so); each
// chosen expert's SwiGLU on its tokens, scaled by the token's weight for it
// (float32), cast back and added into zeros in ascending expert order, so a
// token's experts sum in the order transformers sums them.
torch::Tensor Transformer::moe_block(const torch::Tensor& h, const LayerWeights& w) const {
  const MoeConfig& m = config_.moe;
  const int64_t n = h.size(0), I = m.intermediate_size;
  torch::Tensor probs =
      torch::softmax(linear(h, w.router, torch::Tensor()).to(torch::kFloat32), -1);
  auto [weights, chosen] = torch::topk(probs, m.top_k, -1);
  if (m.normalize_top_k) weights = weights / weights.sum(-1, /*keepdim=*/true);
  // tokens[e], ranks[e]: the (token, rank) pairs routed to expert e.
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(m.n_experts));
  std::vector<std::vector<int64_t>> ranks(static_cast<size_t>(m.n_experts));
  const torch::Tensor picks = chosen.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* pick = picks.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < m.top_k; ++r) {
      const int64_t e = pick[t * m.top_k + r];
      KVSCOPE_CHECK(e >= 0 && e < m.n_experts, "moe_block: topk returned an expert out of range");
      tokens[static_cast<size_t>(e)].push_back(t);
      ranks[static_cast<size_t>(e)].push_back(r);
    }
  torch::Tensor out = torch::zeros_like(h);
  for (int64_t e = 0; e < m.n_experts; ++e) {
    const auto& tok = tokens[static_cast<size_t>(e)];
    if (tok.empty()) continue;
    const torch::Tensor ti = torch::tensor(tok, torch::kInt64).to(h.device());
    const torch::Tensor ri =
        torch::tensor(ranks[static_cast<size_t>(e)], torch::kInt64).to(h.device());
    const torch::Tensor up =
        linear(h.index_select(0, ti), w.experts_up.select(0, e), torch::Tensor());
    const torch::Tensor act = torch::silu(up.narrow(1, 0, I)) * up.narrow(1, I, I);
    const torch::Tensor y = linear(act, w.experts_down.select(0, e), torch::Tensor());
    const torch::Tensor scale = weights.index({ti, ri}).unsqueeze(1);
    out.index_add_(0, ti, (y * scale).to(out.scalar_type()));
  }
  return out;
}

torch::Tensor Transformer::run_layers(const torch::Tensor& tokens, int64_t pos0,
                                      AttentionBackend& backend,
                                      std::vector<torch::Tensor>* attention_out) {
  const int64_t n = tokens.size(0);
  torch::Tensor x = embed(tokens, pos0);
  if (attention_out) x = x.detach().requires_grad_(true);
  if (pos0 == 0 && !announced_) rope_len_ = 0;
  announced_ = false;
  rope_len_ = std::max(rope_len_, pos0 + n);
  torch::Tensor cos, sin;
  if (config_.rope.enabled) std::tie(cos, sin) = rope_.tables(pos0, n, rope_len_);

  backend.begin_step(pos0, n);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    torch::Tensor a =
        attention_block(norm(x, w.attn_norm, w.attn_norm_bias), l, pos0, cos, sin, backend);
    if (attention_out) {
      a.retain_grad();
      attention_out->push_back(a);
    }
    x = x + a;
    x = x + mlp_block(norm(x, w.ffn_norm, w.ffn_norm_bias), l);
  }
  return x;
}

torch::Tensor Transformer::forward_hidden(const torch::Tensor& tokens, int64_t pos0,
                                          AttentionBackend& backend) {
  torch::Tensor x = run_layers(tokens, pos0, backend);
  torch::Tensor hidden = norm(x, weights_.final_norm, weights_.final_norm_bias);
  backend.end_step();
  return hidden;
}

torch::Tensor Transformer::forward_residual(const torch::Tensor& tokens, int64_t pos0,
                                            AttentionBackend& backend,
                                            std::vector<torch::Tensor>* attention_out) {
  torch::Tensor x = run_layers(tokens, pos0, backend, attention_out);
  backend.end_step();
  return x;
}

torch::Tensor Transformer::logits(const torch::Tensor& hidden) const {
  return linear(hidden, weights_.lm_head, torch::Tensor()).to(torch::kFloat32);
}

torch::Tensor Transformer::forward(const torch::Tensor& tokens, int64_t pos0,
                                   AttentionBackend& backend, bool all_logits) {
  torch::Tensor x = run_layers(tokens, pos0, backend);
  if (!all_logits) x = x.narrow(0, x.size(0) - 1, 1);
  torch::Tensor out = logits(norm(x, weights_.final_norm, weights_.final_norm_bias));
  backend.end_step();
  return out;
}

}  // namespace kvscope::model
