// The plain dense KV cache: per layer one preallocated [K, capacity, hd] key
// and value buffer, filled position by position, and exact causal attention
// (with the model's sliding window) over it. No allocation grows per token.
// The policy-shaped cache of `kvscope capture` sits behind the same
// AttentionBackend interface.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"

namespace kvscope::generate {

class DenseKvCache : public model::AttentionBackend {
 public:
  // capacity: the most positions a sequence may reach.
  DenseKvCache(const model::ModelConfig& config, int64_t capacity, torch::Device device,
               torch::ScalarType dtype);

  // The buffers' dtype for the trainers' read-backs (KVzip's targets, the
  // query calibrations, LU-KV's future pass): float32 on the host, where the
  // shared kernels read it with no conversion per step; the model's dtype
  // on a GPU.
  static torch::ScalarType readback_dtype(torch::Device device, torch::ScalarType model_dtype) {
    return device.is_cpu() ? torch::kFloat32 : model_dtype;
  }

  void reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes() const;  // memory held by the buffers

  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;
  void end_step() override;

 private:
  const torch::Tensor& mask(int64_t pos0, int64_t n, int64_t start, int64_t window);
  torch::Tensor attend_shared_kernels(const model::AttentionInputs& in, const torch::Tensor& keys,
                                      const torch::Tensor& values, int64_t start);

  int64_t n_layers_, n_heads_, n_kv_heads_, head_dim_;
  int64_t capacity_;
  int64_t length_ = 0;
  int64_t step_pos0_ = 0, step_n_ = 0;
  std::vector<torch::Tensor> k_, v_;  // per layer [K, capacity, hd]
  // The additive mask of the current step, per window value (layers share it).
  std::vector<std::pair<int64_t, torch::Tensor>> masks_;
};

}  // namespace kvscope::generate
