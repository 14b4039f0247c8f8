#include "capture/model/rope.h"

#include <torch/torch.h>

#include <cmath>

namespace kvscope::model {

namespace {

// transformers: 1 / base ** (arange(0, d, 2).float() / d), all in float32.
torch::Tensor default_inv_freq(double base, int64_t d) {
  torch::Tensor exponent =
      torch::arange(0, d, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(d);
  return 1.0 / torch::pow(base, exponent);
}

// transformers' _compute_llama3_parameters, same operation order.
torch::Tensor llama3_inv_freq(const RopeConfig& c) {
  torch::Tensor inv_freq = default_inv_freq(c.theta, c.dim);
  const double old_len = static_cast<double>(c.original_max_positions);
  const double low_wavelen = old_len / c.low_freq_factor;
  const double high_wavelen = old_len / c.high_freq_factor;
  torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / c.factor, inv_freq);
  torch::Tensor smooth =
      (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  torch::Tensor smoothed = (1 - smooth) * scaled / c.factor + smooth * scaled;
  torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// transformers' _compute_longrope_parameters: 1 / (factor_i * base ** (2i / d)).
torch::Tensor longrope_inv_freq(const RopeConfig& c, const std::vector<double>& factors) {
  torch::Tensor exponent =
      torch::arange(0, c.dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(c.dim);
  torch::Tensor ext = torch::tensor(std::vector<float>(factors.begin(), factors.end()));
  return 1.0 / (ext * torch::pow(c.theta, exponent));
}

// LongRoPE's attention factor multiplies cos and sin (transformers'
// attention_scaling); 1 elsewhere, where the tables are left untouched.
torch::Tensor with_attention_factor(const RopeConfig& c, const torch::Tensor& table) {
  return c.attention_factor == 1.0 ? table : table * c.attention_factor;
}

bool long_sequence(const RopeConfig& c, int64_t seq_len) {
  using S = RopeConfig::Scaling;
  return (c.scaling == S::Dynamic || c.scaling == S::LongRope) &&
         seq_len > c.original_max_positions;
}

}  // namespace

Rope::Rope(const RopeConfig& config, torch::Device device) : config_(config), device_(device) {
  using S = RopeConfig::Scaling;
  if (!config_.freq_divisors.empty()) {
    // GGUF rope_freqs: ggml divides each angle by its factor.
    torch::Tensor div = torch::tensor(config_.freq_divisors, torch::kFloat32);
    base_inv_freq_ = default_inv_freq(config_.theta, config_.dim) / div;
  } else if (config_.scaling == S::Llama3) {
    base_inv_freq_ = llama3_inv_freq(config_);
  } else if (config_.scaling == S::LongRope) {
    base_inv_freq_ = longrope_inv_freq(config_, config_.short_factor);
  } else if (config_.scaling == S::Linear) {
    base_inv_freq_ = default_inv_freq(config_.theta, config_.dim) / config_.factor;
  } else {
    base_inv_freq_ = default_inv_freq(config_.theta, config_.dim);
  }
}

torch::Tensor Rope::inv_freq(int64_t seq_len) const {
  if (!long_sequence(config_, seq_len)) return base_inv_freq_;
  // LongRoPE: the long factors once the sequence outgrows the trained length
  // (transformers decides per forward call by the last position it holds).
  if (config_.scaling == RopeConfig::Scaling::LongRope)
    return longrope_inv_freq(config_, config_.long_factor);
  // Dynamic NTK: a larger base once the sequence outgrows the trained length,
  // computed in float32 tensors as transformers does.
  const double d = static_cast<double>(config_.dim);
  torch::Tensor len = torch::tensor(seq_len, torch::kInt64);
  torch::Tensor ratio =
      config_.factor * len / config_.original_max_positions - (config_.factor - 1);
  torch::Tensor base = config_.theta * torch::pow(ratio, d / (d - 2));
  torch::Tensor exponent = torch::arange(0, config_.dim, 2, torch::kInt64).to(torch::kFloat32) / d;
  return 1.0 / torch::pow(base, exponent);
}

void Rope::grow(int64_t positions) {
  int64_t cap = std::max<int64_t>(capacity_ * 2, 256);
  while (cap < positions) cap *= 2;
  torch::Tensor pos = torch::arange(cap, torch::kInt64).to(torch::kFloat32);
  torch::Tensor freqs = torch::outer(pos, base_inv_freq_);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  cos_ = with_attention_factor(config_, emb.cos()).to(device_);
  sin_ = with_attention_factor(config_, emb.sin()).to(device_);
  capacity_ = cap;
}

std::pair<torch::Tensor, torch::Tensor> Rope::tables(int64_t pos0, int64_t n, int64_t seq_len) {
  if (long_sequence(config_, seq_len)) {
    torch::Tensor pos = torch::arange(pos0, pos0 + n, torch::kInt64).to(torch::kFloat32);
    torch::Tensor freqs = torch::outer(pos, inv_freq(seq_len));
    torch::Tensor emb = torch::cat({freqs, freqs}, -1);
    return {with_attention_factor(config_, emb.cos()).to(device_).unsqueeze(1),
            with_attention_factor(config_, emb.sin()).to(device_).unsqueeze(1)};
  }
  if (pos0 + n > capacity_) grow(pos0 + n);
  return {cos_.narrow(0, pos0, n).unsqueeze(1), sin_.narrow(0, pos0, n).unsqueeze(1)};
}

torch::Tensor Rope::apply(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor xf = x.to(torch::kFloat32);
  torch::Tensor rotated = torch::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

}  // namespace kvscope::model
