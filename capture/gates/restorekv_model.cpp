#include "capture/gates/restorekv_model.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "core/common/input_error.h"

namespace kvscope::gates {

void check_restorekv_model(const model::ModelConfig& c, const std::string& field) {
  if (c.mlp != model::MlpKind::SwiGlu)
    throw InputError("", field,
                     "RestoreKV's LoRA adapts the SwiGLU projections (gate, up, down); " + c.name +
                         " has a GELU MLP");
  if (c.learned_positions)
    throw InputError("", field,
                     "RestoreKV's restore tokens take the positions after the context; " + c.name +
                         " has learned absolute positions, no RoPE");
}

model::ModelConfig restorekv_config(const model::ModelConfig& base, const GateSet& set) {
  model::ModelConfig c = base;
  c.vocab_size += set.param("restore_embeddings").size(0);
  return c;
}

namespace {

// alpha / r * B A for projection `m` of layer l, in the weight's dtype.
torch::Tensor lora_delta(const GateSet& set, int64_t l, const std::string& m, double scale,
                         const torch::Tensor& like) {
  const std::string p = "layers." + std::to_string(l) + ".lora." + m;
  return (set.param(p + ".b").matmul(set.param(p + ".a")) * scale)
      .to(like.device(), like.scalar_type());
}

}  // namespace

model::ModelWeights restorekv_weights(const model::ModelWeights& base, const GateSet& set) {
  const double scale = set.hyper("alpha") / set.hyper("rank");
  model::ModelWeights w = base;  // tensors shared; the adapted ones replaced below
  const torch::Tensor restore =
      set.param("restore_embeddings").to(base.embed.device(), base.embed.scalar_type());
  w.embed = torch::cat({base.embed, restore}, 0);
  w.lm_head = base.lm_head;  // the logits stay over the vocabulary
  for (int64_t l = 0; l < int64_t(base.layers.size()); ++l) {
    const model::LayerWeights& b = base.layers[size_t(l)];
    model::LayerWeights& a = w.layers[size_t(l)];
    if (!b.w_up.defined())
      throw InputError("", "model",
                       "layer " + std::to_string(l) +
                           " is a mixture of experts; RestoreKV's LoRA adapts a dense MLP "
                           "(expected a model without MoE layers)");
    a.wqkv = b.wqkv + torch::cat({lora_delta(set, l, "q", scale, b.wqkv),
                                  lora_delta(set, l, "k", scale, b.wqkv),
                                  lora_delta(set, l, "v", scale, b.wqkv)},
                                 0);
    a.wo = b.wo + lora_delta(set, l, "o", scale, b.wo);
    a.w_up = b.w_up + torch::cat({lora_delta(set, l, "gate", scale, b.w_up),
                                  lora_delta(set, l, "up", scale, b.w_up)},
                                 0);
    a.w_down = b.w_down + lora_delta(set, l, "down", scale, b.w_down);
  }
  return w;
}

void PrefixAttention::begin_step(int64_t, int64_t) {
  new_k.clear();
  new_v.clear();
}

torch::Tensor PrefixAttention::attend(const model::AttentionInputs& in) {
  const size_t l = size_t(in.layer);
  new_k.push_back(in.k);
  new_v.push_back(in.v);
  torch::Tensor k = in.k, v = in.v;
  const int64_t n = in.q.size(0), H = in.q.size(1), K = in.k.size(1), R = H / K;
  const int64_t P = l < prefix_k.size() ? prefix_k[l].size(0) : 0;
  if (P > 0) {
    k = torch::cat({prefix_k[l], k}, 0);
    v = torch::cat({prefix_v[l], v}, 0);
  }
  // visible [K, n, P + n]: the prefix's kept entries, then the causal own part
  const auto flags = torch::TensorOptions().dtype(torch::kBool).device(in.q.device());
  const torch::Tensor own = torch::ones({n, n}, flags).tril().unsqueeze(0).expand({K, n, n});
  const torch::Tensor pre =
      P > 0 ? prefix_keep[l].unsqueeze(1).expand({K, n, P}) : torch::empty({K, n, 0}, flags);
  const torch::Tensor visible = torch::cat({pre, own}, 2);
  const torch::Tensor q = in.q.to(torch::kFloat32).view({n, K, R, -1}).permute({1, 2, 0, 3});
  const torch::Tensor kt = k.to(torch::kFloat32).permute({1, 2, 0}).unsqueeze(1);  // [K, 1, hd, m]
  torch::Tensor s = torch::matmul(q, kt) * in.scale;                               // [K, R, n, m]
  s = s.masked_fill(visible.logical_not().unsqueeze(1), -INFINITY);
  const torch::Tensor vt = v.to(torch::kFloat32).permute({1, 0, 2}).unsqueeze(1);  // [K, 1, m, hd]
  const torch::Tensor o = torch::matmul(torch::softmax(s, -1), vt);                // [K, R, n, hd]
  return o.permute({2, 0, 1, 3}).reshape({n, H, -1}).to(in.q.scalar_type());
}

ContextEntries context_entries(model::Transformer& base, const torch::Tensor& context) {
  PrefixAttention a;
  ContextEntries c;
  c.logits = base.forward(context, 0, a, true);
  c.k = a.new_k;
  c.v = a.new_v;
  return c;
}

torch::Tensor restored_logits(model::Transformer& base, model::Transformer* adapted,
                              const ContextEntries& context, const std::vector<torch::Tensor>& keep,
                              const torch::Tensor& restore_ids, const torch::Tensor& continuation,
                              int64_t pos0) {
  const size_t L = context.k.size();
  const int64_t C = context.k[0].size(0);
  PrefixAttention a;
  a.prefix_k = context.k;
  a.prefix_v = context.v;
  a.prefix_keep = keep;
  if (adapted) {
    const int64_t n = restore_ids.size(0);
    for (size_t l = 0; l < L; ++l) a.prefix_keep[l] = torch::ones_like(keep[l]);
    adapted->forward_hidden(restore_ids, C, a);  // over every context entry
    for (size_t l = 0; l < L; ++l) {
      a.prefix_k[l] = torch::cat({context.k[l], a.new_k[l]}, 0);
      a.prefix_v[l] = torch::cat({context.v[l], a.new_v[l]}, 0);
      a.prefix_keep[l] =
          torch::cat({keep[l], torch::ones({keep[l].size(0), n}, keep[l].options())}, 1);
    }
  }
  return base.forward(continuation, pos0, a, true);
}

}  // namespace kvscope::gates
