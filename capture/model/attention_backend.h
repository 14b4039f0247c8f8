// The seam between the forward pass and the KV cache. The model computes
// projections, norms and RoPE; the backend owns the cache and the attention
// over it. The plain engine uses DenseKvCache; `kvscope capture` uses the
// ragged, policy-shaped cache (capture/cache) behind the same interface, and
// the gate trainer uses a differentiable backend over whole sequences.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace kvscope::model {

// Everything a layer's attention (and a policy's gate) may need about the
// tokens of one forward step. Single sequence, no batch axis.
struct AttentionInputs {
  int64_t layer = 0;
  int64_t pos0 = 0;            // position of the first new token
  torch::Tensor hidden;        // [n, D] the layer's normalised input (after input norm)
  torch::Tensor q;             // [n, H, hd] after q bias/norm and RoPE
  torch::Tensor k_pre_rope;    // [n, K, hd] after k bias/norm, before RoPE
  torch::Tensor k;             // [n, K, hd] after RoPE (what the cache stores)
  torch::Tensor v;             // [n, K, hd]
  double scale = 1.0;          // softmax scale (1/sqrt(hd), GPT-2 options included)
  int64_t sliding_window = 0;  // the model's own window for this layer, 0 = none
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // Before the first layer of a step that feeds n tokens at positions
  // [pos0, pos0 + n).
  virtual void begin_step(int64_t pos0, int64_t n) {}
  // Stores the new keys/values as the cache decides and returns the attention
  // output [n, H, hd]: query i attends causally to what the cache holds plus
  // the new tokens up to i (within the model's sliding window).
  virtual torch::Tensor attend(const AttentionInputs& in) = 0;
  // After the last layer of the step (logits are known to the caller).
  virtual void end_step() {}
  // Side passes (a policy's context-reconstruction pass, after the prefill):
  // while on, steps feed tokens that are not part of the sequence, and the
  // backend leaves no entry of theirs in the cache. A backend that cannot
  // returns false (the generator then refuses the run).
  virtual bool set_side_pass(bool on) { return !on; }
  // Probe mode (the generator's answer probe): the steps fed meanwhile read
  // the cache as it stands and leave no trace in it, no policy decision and
  // no step of the sequence. Returns whether the backend can run them.
  virtual bool set_probe_pass(bool on) { return !on; }
};

}  // namespace kvscope::model
