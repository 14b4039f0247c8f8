#include "capture/policy/policies/output_projection.h"

#include <cmath>
#include <limits>

#include "core/common/check.h"

namespace kvscope::policy {

void OutputNorms::setup(std::vector<torch::Tensor> wo, int64_t n_kv_heads, int64_t max_tokens) {
  wo_ = std::move(wo), K_ = n_kv_heads, M_ = max_tokens;
  norm_.assign(size_t(int64_t(wo_.size()) * K_ * M_), std::numeric_limits<float>::quiet_NaN());
}

void OutputNorms::of(const cache::RaggedKvCache& cache, int64_t layer, int64_t kv_head,
                     const std::vector<int32_t>& pos, float* out) {
  KVSCOPE_CHECK(layer < int64_t(wo_.size()) && kv_head < K_, "OutputNorms: head out of range");
  float* norm = norm_.data() + (layer * K_ + kv_head) * M_;
  const int64_t hd = cache.head_dim();
  missing_.clear(), values_.clear();
  key_.resize(size_t(hd));
  for (int32_t p : pos) {
    KVSCOPE_CHECK(p >= 0 && p < M_, "OutputNorms: position out of range");
    if (!std::isnan(norm[p])) continue;
    missing_.push_back(p);
    values_.resize(values_.size() + size_t(hd));
    cache.read_entry(layer, kv_head, p, key_.data(), values_.data() + values_.size() - size_t(hd));
  }
  if (!missing_.empty()) compute(layer, kv_head, values_, missing_);
  for (size_t j = 0; j < pos.size(); ++j) out[j] = norm[pos[j]];
}

// A prefill's hundreds of rows go through one product; a decode step's
// row or two through plain loops (the tensor ops' dispatch would cost more
// than the arithmetic). Both compute mean_r sum_D |sum_i v_i W_o[r, i, D]|.
void OutputNorms::compute(int64_t layer, int64_t kv_head, const std::vector<float>& values,
                          const std::vector<int32_t>& pos) {
  const torch::Tensor& wo = wo_[size_t(layer)];  // [H, hd, D]
  const int64_t H = wo.size(0), hd = wo.size(1), D = wo.size(2), R = H / K_,
                n = int64_t(pos.size());
  float* norm = norm_.data() + (layer * K_ + kv_head) * M_;
  if (n > 8) {
    const torch::Tensor v =
        torch::from_blob(const_cast<float*>(values.data()), {n, hd}, torch::kFloat32);
    const torch::Tensor s = output_l1_norms(wo, kv_head, R, v);
    const float* sp = s.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) norm[pos[size_t(j)]] = sp[j];
    return;
  }
  std::vector<float> acc(static_cast<size_t>(D));
  for (int64_t j = 0; j < n; ++j) {
    const float* v = values.data() + j * hd;
    float total = 0;
    for (int64_t r = 0; r < R; ++r) {
      const float* w = wo.data_ptr<float>() + (kv_head * R + r) * hd * D;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < hd; ++i)
        for (int64_t e = 0; e < D; ++e) acc[size_t(e)] += v[i] * w[i * D + e];
      float l1 = 0;
      for (float a : acc) l1 += std::fabs(a);
      total += l1;
    }
    norm[pos[size_t(j)]] = total / float(R);
  }
}

}  // namespace kvscope::policy
