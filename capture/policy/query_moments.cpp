#include "capture/policy/query_moments.h"

#include <torch/torch.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/common/check.h"

namespace kvscope::policy {

void QueryMoments::setup(const model::ModelConfig& m, int64_t sinks, bool second_moments) {
  sinks_ = sinks, H_ = m.n_heads, d_ = m.head_dim, second_ = second_moments;
  rope_.reset();
  if (m.rope.enabled && !m.learned_positions)
    rope_ = std::make_unique<model::Rope>(m.rope, torch::Device(torch::kCPU));
  rope_factor_ = m.rope.attention_factor;
  // One tensor per layer (assign() would share one storage between layers).
  sum_.clear(), sum_sq_.clear();
  for (int64_t l = 0; l < m.n_layers; ++l) {
    sum_.push_back(torch::zeros({H_, d_}, torch::kFloat64));
    if (second_) sum_sq_.push_back(torch::zeros({H_, d_, d_}, torch::kFloat64));
  }
  count_.assign(size_t(m.n_layers), 0);
}

void QueryMoments::add(int64_t layer, const torch::Tensor& q_rotated, int64_t pos0,
                       int64_t seq_len) {
  const int64_t n = q_rotated.size(0);
  const int64_t first = std::max<int64_t>(0, sinks_ - pos0);
  if (first >= n) return;
  if (n - first <= kFewTokens) return add_few(layer, q_rotated, pos0, seq_len, first);
  torch::Tensor q = q_rotated.to(torch::kFloat32);  // [n, H, hd]
  if (rope_) {
    auto [cos, sin] = rope_->tables(pos0, n, seq_len);
    // The inverse of a R(t) (LongRoPE's attention factor a) is R(-t) / a.
    const double a2 = rope_factor_ * rope_factor_;
    q = model::Rope::apply(q, a2 == 1.0 ? cos : cos / a2, a2 == 1.0 ? -sin : -sin / a2);
  }
  torch::Tensor qd = q.narrow(0, first, n - first).to(torch::kFloat64);
  sum_[size_t(layer)] += qd.sum(0);
  if (second_) sum_sq_[size_t(layer)] += torch::einsum("nhi,nhj->hij", {qd, qd});
  count_[size_t(layer)] += n - first;
}

// A decode step's query in plain loops: the dozen tensor ops of add() cost
// more than its arithmetic (docs/performance.md, "Every policy's cost").
void QueryMoments::add_few(int64_t layer, const torch::Tensor& q_rotated, int64_t pos0,
                           int64_t seq_len, int64_t first) {
  const int64_t n = q_rotated.size(0), d = d_;
  const torch::Tensor q = q_rotated.to(torch::kFloat32).contiguous();  // [n, H, hd]
  KVSCOPE_CHECK(q.size(1) == H_ && q.size(2) == d, "QueryMoments: query shape");
  torch::Tensor cos, sin;
  if (rope_) std::tie(cos, sin) = rope_->tables(pos0, n, seq_len);
  const torch::Tensor c = rope_ ? cos.contiguous() : cos, s = rope_ ? sin.contiguous() : sin;
  const double inv_a2 = 1.0 / (rope_factor_ * rope_factor_);
  const int64_t half = d / 2;
  double* sum = sum_[size_t(layer)].data_ptr<double>();
  double* sq = second_ ? sum_sq_[size_t(layer)].data_ptr<double>() : nullptr;
  std::vector<double> x(static_cast<size_t>(d));
  for (int64_t t = first; t < n; ++t) {
    for (int64_t h = 0; h < H_; ++h) {
      const float* qh = q.data_ptr<float>() + (t * H_ + h) * d;
      if (rope_) {
        // R(-t) / a: x cos - rotate_half(x) sin, both tables over a^2 (as add()).
        const float* ct = c.data_ptr<float>() + t * d;
        const float* st = s.data_ptr<float>() + t * d;
        for (int64_t i = 0; i < d; ++i) {
          const float rot = i < half ? -qh[i + half] : qh[i - half];
          const float ci = inv_a2 == 1.0 ? ct[i] : float(ct[i] * inv_a2);
          const float si = inv_a2 == 1.0 ? st[i] : float(st[i] * inv_a2);
          x[size_t(i)] = double(qh[i] * ci + rot * -si);
        }
      } else {
        for (int64_t i = 0; i < d; ++i) x[size_t(i)] = qh[i];
      }
      double* sh = sum + h * d;
      for (int64_t i = 0; i < d; ++i) sh[i] += x[size_t(i)];
      if (!sq) continue;
      double* qq = sq + h * d * d;
      for (int64_t i = 0; i < d; ++i)
        for (int64_t j = 0; j < d; ++j) qq[i * d + j] += x[size_t(i)] * x[size_t(j)];
    }
  }
  count_[size_t(layer)] += n - first;
}

torch::Tensor QueryMoments::mean(int64_t layer) const {
  return sum_[size_t(layer)] / double(count_[size_t(layer)]);
}

torch::Tensor QueryMoments::covariance(int64_t layer) const {
  const torch::Tensor mu = mean(layer);
  return sum_sq_[size_t(layer)] / double(count_[size_t(layer)]) -
         torch::einsum("hi,hj->hij", {mu, mu});
}

torch::Tensor QueryMoments::averaged_rotation(int64_t t0, int64_t n) {
  if (!rope_) return torch::eye(d_, torch::kFloat64);
  // R(t) = diag(cos_t) + diag-columns(sin_t) P with P x = rotate_half(x).
  auto [cos, sin] = rope_->tables(t0, n, t0 + n);
  torch::Tensor cbar = cos.squeeze(1).to(torch::kFloat64).mean(0),
                sbar = sin.squeeze(1).to(torch::kFloat64).mean(0);
  torch::Tensor P = torch::zeros({d_, d_}, torch::kFloat64);
  const int64_t half = d_ / 2;
  P.narrow(0, half, half).narrow(1, 0, half).copy_(torch::eye(half, torch::kFloat64));
  P.narrow(0, 0, half).narrow(1, half, half).copy_(-torch::eye(half, torch::kFloat64));
  return torch::diag(cbar) + sbar.unsqueeze(0) * P;
}

}  // namespace kvscope::policy
