#include "capture/model/cpu_ops.h"

#include <torch/torch.h>

#include <cmath>

namespace kvscope::model::cpu_ops {

bool eligible(const torch::Tensor& t) {
  return !torch::GradMode::is_enabled() && t.device().is_cpu() &&
         t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const int64_t D = x.size(-1), rows = x.numel() / D;
  torch::Tensor out = torch::empty_like(x);
  const float* in = x.data_ptr<float>();
  const float* weight = w.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = in + r * D;
    double sum = 0;
    for (int64_t j = 0; j < D; ++j) sum += static_cast<double>(xr[j]) * xr[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(D) + eps));
    float* orow = o + r * D;
    for (int64_t j = 0; j < D; ++j) orow[j] = weight[j] * (xr[j] * inv);
  }
  return out;
}

void rope_inplace(float* x, int64_t n, int64_t row_stride, int64_t heads, int64_t hd,
                  const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* c = cos + i * hd;
    const float* s = sin + i * hd;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + i * row_stride + h * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j + half] + a * s[j + half];
      }
    }
  }
}

torch::Tensor swiglu(const torch::Tensor& gu, int64_t I) {
  const int64_t n = gu.size(0);
  torch::Tensor out = torch::empty({n, I}, gu.options());
  const float* in = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* g = in + i * 2 * I;
    const float* u = g + I;
    float* orow = o + i * I;
    for (int64_t j = 0; j < I; ++j) orow[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
  return out;
}

}  // namespace kvscope::model::cpu_ops
