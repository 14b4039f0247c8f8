// The output projection's view of a value: CriticalKV's ||v W_o^r||_1, shared
// by criticalkv.cpp and critical_adakv.cpp.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "capture/cache/ragged_cache.h"
#include "capture/model/model_weights.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

// W_o of every layer as [H, hd, D] (x W_o^r for a row x of query head r), in
// float32 on `device`. Policies keep the host default whatever the model's
// device: they see host tensors (StepDriver::use_device); the trainers'
// read-backs ask for the model's device.
inline std::vector<torch::Tensor> per_head_output_projections(const model::ModelWeights* w,
                                                              int64_t H, int64_t hd,
                                                              const std::string& policy,
                                                              torch::Device device = torch::kCPU) {
  if (!w || w->layers.empty())
    throw InputError("--policy", policy, "needs the model's output projection (W_o)");
  std::vector<torch::Tensor> out;
  for (const model::LayerWeights& l : w->layers)
    out.push_back(l.wo.to(device, torch::kFloat32).t().reshape({H, hd, -1}).contiguous());
  return out;
}

// mean over the kv head's R query heads of ||v W_o^r||_1, per row of values [m, hd] -> [m].
inline torch::Tensor output_l1_norms(const torch::Tensor& wo_layer, int64_t kv_head, int64_t R,
                                     const torch::Tensor& values) {
  torch::Tensor wo = wo_layer.narrow(0, kv_head * R, R);  // [R, hd, D]
  return values.unsqueeze(0).matmul(wo).abs().sum(-1).mean(0).contiguous();
}

// output_l1_norms of the entries a head holds, each computed once: a held
// value does not change (no policy that reads these merges values), so a
// decode step computes the norms of its new entries only, where recomputing
// every held entry's cost CriticalKV 88 ms a step on SmolLM2
// (docs/performance.md "Every policy's cost per decode step").
class OutputNorms {
 public:
  void setup(std::vector<torch::Tensor> wo, int64_t n_kv_heads, int64_t max_tokens);
  // out[j] = the norm of the entry at pos[j], which (layer, kv_head) holds.
  void of(const cache::RaggedKvCache& cache, int64_t layer, int64_t kv_head,
          const std::vector<int32_t>& pos, float* out);

 private:
  void compute(int64_t layer, int64_t kv_head, const std::vector<float>& values,
               const std::vector<int32_t>& pos);
  std::vector<torch::Tensor> wo_;  // per layer [H, hd, D]
  int64_t K_ = 0, M_ = 0;
  std::vector<float> norm_;          // [L, K, M], NaN until computed
  std::vector<float> values_, key_;  // scratch
  std::vector<int32_t> missing_;
};

}  // namespace kvscope::policy
