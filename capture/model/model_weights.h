// The weights of a decoder-only transformer in the layout the forward pass
// uses: every linear weight as [out, in] (PyTorch Linear), q and k rows in the
// HF rotate-half order, q/k/v fused into one matrix and gate/up fused into
// one, so a decode step runs one GEMV for each. Undefined tensors mean
// "absent" (no bias, no q/k norm, ...).
#pragma once

#include <torch/types.h>

#include <vector>

namespace kvscope::model {

struct LayerWeights {
  torch::Tensor attn_norm, attn_norm_bias;  // [D] (bias: LayerNorm only)
  torch::Tensor wqkv, bqkv;                 // [(H + 2K) * hd, D], [(H + 2K) * hd]
  torch::Tensor q_norm, k_norm;             // [hd] (Qwen3)
  torch::Tensor wo, bo;                     // [D, H * hd], [D]
  torch::Tensor ffn_norm, ffn_norm_bias;    // [D]
  torch::Tensor w_up, b_up;                 // SwiGLU: [2I, D] gate rows then up rows; GELU: [I, D]
  torch::Tensor w_down, b_down;             // [D, I], [D]
  // A mixture-of-experts layer instead of w_up/w_down (model_config.h MoeConfig).
  torch::Tensor router;        // [E, D]
  torch::Tensor experts_up;    // [E, 2I, D]: each expert's gate rows then its up rows
  torch::Tensor experts_down;  // [E, D, I]
};

// Every tensor slot of a layer (defined or not), in declaration order: the
// one list the loaders, the device moves and the counters walk.
std::vector<torch::Tensor*> layer_slots(LayerWeights& l);
std::vector<const torch::Tensor*> layer_slots(const LayerWeights& l);

struct ModelWeights {
  torch::Tensor embed;      // [V, D]
  torch::Tensor pos_embed;  // [P, D] (GPT-2)
  std::vector<LayerWeights> layers;
  torch::Tensor final_norm, final_norm_bias;  // [D]
  torch::Tensor lm_head;                      // [V, D]; the same tensor as embed when tied
};

// Every distinct defined tensor, tied ones once (lm_head is left out when it
// is embed), in a fixed order: embed, pos_embed, the layers' fields in
// declaration order, the final norm, lm_head.
std::vector<torch::Tensor> weight_tensors(const ModelWeights& w);

// Fresh, writable copies (detached, contiguous) of every tensor, the tying of
// lm_head to embed kept: the loaders hand out views of read-only memory maps,
// which a fine-tuning run must not update in place.
ModelWeights clone_weights(const ModelWeights& w);

}  // namespace kvscope::model
