// RestoreKV's restore pass model (Baek et al., "RestoreKV: Recovering
// Full-Cache Behavior Under Aggressive Query-Agnostic KV Cache Eviction",
// arXiv 2608.01247; kvpress RestoreKVPress; docs/policies/restorekv.md): the
// base model with its LoRA adapters on (W + alpha/r * B A on q, k, v, o,
// gate, up and down) and the n learned restore embeddings as extra rows of
// its embedding table, ids V .. V+n-1. The restore tokens are fed through it
// once, right after the prefill, over the full cache; the adapters are off
// for everything else. Shared by the policy (policies/restorekv.cpp) and the
// trainer (restorekv_training.cpp): built from the gate file's tensors, so
// it is differentiable in them when they require grad.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/model/model_weights.h"
#include "capture/model/transformer.h"

namespace kvscope::gates {

// Throws InputError naming `field` when RestoreKV cannot adapt this model
// (its LoRA targets are SwiGLU's gate, up and down projections).
void check_restorekv_model(const model::ModelConfig& c, const std::string& field);

// The adapted model's config: the base's, vocab_size + n.
model::ModelConfig restorekv_config(const model::ModelConfig& base, const GateSet& set);
// The adapted weights: the fused q/k/v and gate/up weights and o and down
// with their LoRA deltas added, the embedding table with the restore rows
// appended; everything else shared with `base` (lm_head keeps V rows).
model::ModelWeights restorekv_weights(const model::ModelWeights& base, const GateSet& set);

// Dense attention of a step's queries over a prefix of entries (per layer
// [P, K, hd] from earlier passes, keep mask [K, P]) and the step's own keys,
// causally; records each layer's new keys and values. Differentiable in the
// prefix and in the step. The trainer's backend, and the tests' reference.
class PrefixAttention : public model::AttentionBackend {
 public:
  std::vector<torch::Tensor> prefix_k, prefix_v, prefix_keep;  // per layer (empty: none)
  std::vector<torch::Tensor> new_k, new_v;                     // per layer, of the last step

  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;
};

// A context's entries per layer ([C, K, hd] keys after RoPE and values):
// the base model over `context` at positions 0.. with every entry kept.
struct ContextEntries {
  std::vector<torch::Tensor> k, v;
  torch::Tensor logits;  // [C, V] float32
};
ContextEntries context_entries(model::Transformer& base, const torch::Tensor& context);

// The logits [U, V] of `continuation` fed at positions pos0.. through the
// base model reading the context entries `keep` (per layer [K, C]) lets
// through and, when `adapted` is given, the entries of the restore pass:
// restore_ids fed at positions C.. through `adapted` over every context
// entry. RestoreKV's student (pos0 = C + n); with adapted null, KVzip alone.
torch::Tensor restored_logits(model::Transformer& base, model::Transformer* adapted,
                              const ContextEntries& context, const std::vector<torch::Tensor>& keep,
                              const torch::Tensor& restore_ids, const torch::Tensor& continuation,
                              int64_t pos0);

}  // namespace kvscope::gates
