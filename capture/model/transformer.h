// The forward pass of every supported decoder-only transformer: one design,
// with the per-architecture differences reduced to switches in ModelConfig
// (RMSNorm or LayerNorm, SwiGLU or GELU, biases, q/k norm, RoPE or learned
// positions). Attention over the cache is delegated to an AttentionBackend.
//
// Autograd-friendly: no grad guards inside (callers choose), weights have
// requires_grad=false, and the in-place fast paths are only taken when grad
// mode is off.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/model/model_weights.h"
#include "capture/model/rope.h"

namespace kvscope::model {

class Transformer {
 public:
  Transformer(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  torch::Device device() const { return weights_.embed.device(); }
  torch::ScalarType dtype() const { return weights_.embed.scalar_type(); }
  int64_t parameter_count() const;
  int64_t weight_bytes() const;  // bytes of distinct weight tensors

  // Feeds tokens [n] (int64) at positions [pos0, pos0 + n) through every
  // layer, calling backend.begin_step, attend for each layer, end_step.
  // Returns float32 logits [n, V] when all_logits, else [1, V] for the last
  // token.
  torch::Tensor forward(const torch::Tensor& tokens, int64_t pos0, AttentionBackend& backend,
                        bool all_logits = false);

  // Final-norm hidden states [n, D] instead of logits (for the gate trainer
  // and probes); the same calls to the backend, end_step included.
  torch::Tensor forward_hidden(const torch::Tensor& tokens, int64_t pos0,
                               AttentionBackend& backend);
  torch::Tensor logits(const torch::Tensor& hidden) const;  // [n, D] -> float32 [n, V]

  // For gradient attribution (KVgrad): the residual stream after the last
  // layer, before the final norm [n, D], from an embedding that requires grad
  // (the weights need none); each layer's projected attention output (what it
  // adds to the residual stream) is appended to `attention_out` with its
  // gradient retained. Call with grad mode on, outside inference mode.
  torch::Tensor forward_residual(const torch::Tensor& tokens, int64_t pos0,
                                 AttentionBackend& backend,
                                 std::vector<torch::Tensor>* attention_out);

  // Dynamic NTK RoPE uses frequencies of the longest sequence seen so far
  // (as transformers does). A caller that prefills in chunks announces the
  // full prompt length first so every chunk uses the same frequencies.
  // Without an announcement, a forward at position 0 starts a new sequence.
  void announce_sequence_length(int64_t n) {
    rope_len_ = n;
    announced_ = true;
  }

 private:
  torch::Tensor run_layers(const torch::Tensor& tokens, int64_t pos0, AttentionBackend& backend,
                           std::vector<torch::Tensor>* attention_out = nullptr);
  torch::Tensor embed(const torch::Tensor& tokens, int64_t pos0) const;
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) const;
  torch::Tensor attention_block(const torch::Tensor& x, int64_t layer, int64_t pos0,
                                const torch::Tensor& cos, const torch::Tensor& sin,
                                AttentionBackend& backend) const;
  torch::Tensor mlp_block(const torch::Tensor& x, int64_t layer) const;
  torch::Tensor moe_block(const torch::Tensor& x, const LayerWeights& w) const;

  ModelConfig config_;
  ModelWeights weights_;
  Rope rope_;
  int64_t rope_len_ = 0;
  bool announced_ = false;
};

}  // namespace kvscope::model
