// What the future queries of a layer look like, from the queries seen so far:
// the running first and second moments of the pre-RoPE queries, and RoPE's
// rotation averaged over the next positions. Expected attention (its Gaussian
// model of future queries), CAPKV (its query anchor) and the query-statistics
// calibration share them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "capture/model/model_config.h"
#include "capture/model/rope.h"

namespace kvscope::policy {

class QueryMoments {
 public:
  // Queries at positions >= sinks count; second moments only when asked.
  void setup(const model::ModelConfig& m, int64_t sinks, bool second_moments);
  // Adds the pre-RoPE queries of n tokens at pos0.. of a sequence of seq_len
  // tokens: q [n, H, hd] after RoPE, as the model hands them over (RoPE is a
  // rotation: rotating back recovers them exactly up to float rounding).
  void add(int64_t layer, const torch::Tensor& q, int64_t pos0, int64_t seq_len);
  int64_t count(int64_t layer) const { return count_[size_t(layer)]; }
  torch::Tensor mean(int64_t layer) const;        // [H, hd] float64
  torch::Tensor covariance(int64_t layer) const;  // [H, hd, hd] float64, biased
  // Mean over positions t0 .. t0 + n - 1 of RoPE's rotation R(t) (x -> R x,
  // rotate-half convention), [hd, hd] float64; the identity without RoPE.
  torch::Tensor averaged_rotation(int64_t t0, int64_t n);

 private:
  static constexpr int64_t kFewTokens = 4;  // add() in loops up to this many tokens
  void add_few(int64_t layer, const torch::Tensor& q, int64_t pos0, int64_t seq_len, int64_t first);
  int64_t sinks_ = 0, H_ = 0, d_ = 0;
  bool second_ = false;
  std::unique_ptr<model::Rope> rope_;
  double rope_factor_ = 1.0;                 // LongRoPE's attention factor, in the tables
  std::vector<torch::Tensor> sum_, sum_sq_;  // per layer [H, d], [H, d, d]
  std::vector<int64_t> count_;
};

}  // namespace kvscope::policy
