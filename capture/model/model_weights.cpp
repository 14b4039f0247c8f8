#include "capture/model/model_weights.h"

#include <torch/torch.h>

#include <unordered_set>

namespace kvscope::model {

namespace {

template <class L>
auto slots_of_layer(L& l) {
  using T = decltype(&l.wqkv);
  return std::vector<T>{
      &l.attn_norm, &l.attn_norm_bias, &l.wqkv,          &l.bqkv, &l.q_norm, &l.k_norm, &l.wo,
      &l.bo,        &l.ffn_norm,       &l.ffn_norm_bias, &l.w_up, &l.b_up,   &l.w_down, &l.b_down,
      &l.router,    &l.experts_up,     &l.experts_down};
}

// Pointers to every slot of `w` (ModelWeights or const ModelWeights), lm_head last.
template <class W>
auto slots(W& w) {
  using T = decltype(&w.embed);
  std::vector<T> out = {&w.embed, &w.pos_embed};
  for (auto& l : w.layers)
    for (T t : layer_slots(l)) out.push_back(t);
  for (T t : {&w.final_norm, &w.final_norm_bias, &w.lm_head}) out.push_back(t);
  return out;
}

}  // namespace

std::vector<torch::Tensor*> layer_slots(LayerWeights& l) {
  return slots_of_layer(l);
}
std::vector<const torch::Tensor*> layer_slots(const LayerWeights& l) {
  return slots_of_layer(l);
}

std::vector<torch::Tensor> weight_tensors(const ModelWeights& w) {
  std::vector<torch::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const torch::Tensor* t : slots(w))
    if (t->defined() && seen.insert(t->unsafeGetTensorImpl()).second) out.push_back(*t);
  return out;
}

ModelWeights clone_weights(const ModelWeights& w) {
  ModelWeights c = w;
  const bool tied = w.lm_head.defined() && w.lm_head.is_same(w.embed);
  for (torch::Tensor* t : slots(c))
    if (t->defined()) *t = t->detach().clone(torch::MemoryFormat::Contiguous);
  if (tied) c.lm_head = c.embed;
  return c;
}

}  // namespace kvscope::model
