// Rotary position embeddings in the HF "rotate-half" convention (element i
// pairs with i + d/2; formats.md §2.5). Sources in Meta/interleaved order are
// permuted at load, so this is the only rotation in the engine. Frequencies
// follow transformers' float32 arithmetic: default, linear, dynamic NTK,
// llama3, or GGUF rope_freqs divisors.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

#include "capture/model/model_config.h"

namespace kvscope::model {

class Rope {
 public:
  Rope(const RopeConfig& config, torch::Device device);

  // inv_freq [d/2] float32 for a sequence of `seq_len` tokens (only dynamic
  // scaling depends on it).
  torch::Tensor inv_freq(int64_t seq_len) const;
  // cos and sin [n, 1, d] (float32) for positions [pos0, pos0 + n) of a
  // sequence whose frequencies are those of length `seq_len`.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t pos0, int64_t n, int64_t seq_len);
  // x [n, heads, d] rotated; computed in float32, returned in x's dtype.
  static torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& cos,
                             const torch::Tensor& sin);

 private:
  void grow(int64_t positions);
  RopeConfig config_;
  torch::Device device_;
  torch::Tensor base_inv_freq_;  // the length-independent frequencies
  torch::Tensor cos_, sin_;      // [capacity, d] for base_inv_freq_
  int64_t capacity_ = 0;
};

}  // namespace kvscope::model
