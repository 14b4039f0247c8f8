#include "capture/generate/dense_kv_cache.h"

#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/common/check.h"
#include "kernels/attention.h"
#include "kernels/row_convert.h"

namespace kvscope::generate {

DenseKvCache::DenseKvCache(const model::ModelConfig& c, int64_t capacity, torch::Device device,
                           torch::ScalarType dtype)
    : n_layers_(c.n_layers),
      n_heads_(c.n_heads),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      capacity_(capacity) {
  if (capacity <= 0) throw std::invalid_argument("DenseKvCache: capacity must be positive");
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  for (int64_t l = 0; l < n_layers_; ++l) {
    k_.push_back(torch::empty({n_kv_heads_, capacity_, head_dim_}, options));
    v_.push_back(torch::empty({n_kv_heads_, capacity_, head_dim_}, options));
  }
}

int64_t DenseKvCache::bytes() const {
  int64_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l].nbytes() + v_[l].nbytes();
  return b;
}

void DenseKvCache::begin_step(int64_t pos0, int64_t n) {
  // A dense cache holds every position, so steps must follow one another.
  KVSCOPE_CHECK(pos0 == length_, "DenseKvCache: step at position " + std::to_string(pos0) +
                                     " but the cache holds " + std::to_string(length_) +
                                     " positions");
  KVSCOPE_CHECK(pos0 + n <= capacity_, "DenseKvCache: " + std::to_string(pos0 + n) +
                                           " positions exceed the capacity " +
                                           std::to_string(capacity_));
  step_pos0_ = pos0;
  step_n_ = n;
  masks_.clear();
}

// Additive mask [n, L - start]: 0 where query pos0+i may see key start+j
// (causal, and within the window), -inf elsewhere.
const torch::Tensor& DenseKvCache::mask(int64_t pos0, int64_t n, int64_t start, int64_t window) {
  for (const auto& [w, m] : masks_)
    if (w == window) return m;
  const int64_t L = pos0 + n;
  torch::Tensor qpos = torch::arange(pos0, L, torch::kInt64).unsqueeze(1);
  torch::Tensor kpos = torch::arange(start, L, torch::kInt64).unsqueeze(0);
  torch::Tensor allowed = kpos <= qpos;
  if (window > 0) allowed = allowed.logical_and(kpos > qpos - window);
  torch::Tensor m =
      torch::zeros({n, L - start}, torch::kFloat32)
          .masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity())
          .to(k_[0].device());
  masks_.emplace_back(window, m);
  return masks_.back().second;
}

torch::Tensor DenseKvCache::attend(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0), pos0 = in.pos0;
  const int64_t H = n_heads_, K = n_kv_heads_, hd = head_dim_, R = H / K;
  const int64_t L = pos0 + n;
  k_[l].narrow(1, pos0, n).copy_(in.k.transpose(0, 1));
  v_[l].narrow(1, pos0, n).copy_(in.v.transpose(0, 1));

  // Keys older than the window of the first query are never visible.
  const int64_t start =
      in.sliding_window > 0 ? std::max<int64_t>(0, pos0 - in.sliding_window + 1) : 0;
  torch::Tensor keys = k_[l].narrow(1, start, L - start);
  torch::Tensor values = v_[l].narrow(1, start, L - start);

  // On the CPU: the kernels the ragged cache uses, so a ragged cache holding
  // every entry (policy "full") computes bit-identical logits. They read
  // float32 or 16-bit rows and accumulate in float32 (LibTorch 1.13's CPU
  // bmm accumulates reduced-precision products in the reduced type: bf16,
  // head_dim 64, 300 keys, 0.34 max error on q.k against 0.06 for one
  // rounding of the exact product; transformers and every GPU library
  // accumulate in float32).
  if (keys.device().is_cpu())
    return attend_shared_kernels(in, keys, values, start).to(in.q.scalar_type());

  // A --kv-dtype other than the model's: the products in the model's dtype.
  if (keys.scalar_type() != in.q.scalar_type()) {
    keys = keys.to(in.q.scalar_type());
    values = values.to(in.q.scalar_type());
  }
  // Query heads grouped by their kv head: [K, R * n, hd] (HF repeat_kv order).
  torch::Tensor q = in.q.permute({1, 0, 2}).reshape({K, R * n, hd});
  torch::Tensor scores = torch::bmm(q, keys.transpose(1, 2));
  if (scores.scalar_type() != torch::kFloat32)
    scores = scores.to(torch::kFloat32);  // softmax in fp32
  scores.mul_(in.scale);
  const bool need_mask = n > 1 || (in.sliding_window > 0 && L - start > in.sliding_window);
  if (need_mask)
    scores = (scores.view({K, R, n, L - start}) + mask(pos0, n, start, in.sliding_window))
                 .view({K, R * n, L - start});
  torch::Tensor probs = torch::softmax(scores, -1);
  if (probs.scalar_type() != values.scalar_type()) probs = probs.to(values.scalar_type());
  torch::Tensor out = torch::bmm(probs, values);  // [K, R * n, hd]
  return out.view({H, n, hd}).permute({1, 0, 2});
}

torch::Tensor DenseKvCache::attend_shared_kernels(const model::AttentionInputs& in,
                                                  const torch::Tensor& keys,
                                                  const torch::Tensor& values, int64_t start) {
  const int64_t n = in.q.size(0), K = n_kv_heads_, hd = head_dim_, R = n_heads_ / K;
  const int64_t m = keys.size(1);
  torch::Tensor pos = torch::arange(start, start + m, torch::kInt64);
  if (n == 1) {
    // Decode: every kv head in one call (one split over the kernel threads).
    // q [1, H, hd] holds the R query heads of kv head h at rows h * R ...
    torch::Tensor q = in.q.to(torch::kFloat32).contiguous();
    torch::Tensor out = torch::empty({1, n_heads_, hd}, torch::kFloat32);
    std::vector<std::vector<kernels::Segment>> segs(static_cast<size_t>(K));
    std::vector<kernels::DecodeHead> heads;
    const kernels::RowType type = kernels::row_type_of(keys.scalar_type());
    for (int64_t h = 0; h < K; ++h) {
      torch::Tensor kh = keys[h], vh = values[h];  // [m, hd], rows hd apart
      segs[size_t(h)] = {{kh.data_ptr(), vh.data_ptr(), m, hd, type}};
      heads.push_back({q.data_ptr<float>() + h * R * hd, &segs[size_t(h)], pos.data_ptr<int64_t>(),
                       out.data_ptr<float>() + h * R * hd, nullptr});
    }
    kernels::attention_decode_heads(heads.data(), K, R, hd, in.pos0, in.scale, in.sliding_window);
    return out;
  }
  // Prefill: the (kv head, query block) pairs of the layer in one split.
  std::vector<torch::Tensor> q, k, v;
  for (int64_t h = 0; h < K; ++h) {
    q.push_back(in.q.narrow(1, h * R, R).permute({1, 0, 2}).to(torch::kFloat32).contiguous());
    k.push_back(keys[h].to(torch::kFloat32));  // 16-bit rows: float32 copies for BLAS
    v.push_back(values[h].to(torch::kFloat32));
  }
  const std::vector<torch::Tensor> oh =
      kernels::attention_multi_heads(q, k, v, pos, in.pos0, in.scale, in.sliding_window);
  torch::Tensor out = torch::empty({n, n_heads_, hd}, torch::kFloat32);
  for (int64_t h = 0; h < K; ++h) out.narrow(1, h * R, R).copy_(oh[size_t(h)].permute({1, 0, 2}));
  return out;
}

void DenseKvCache::end_step() {
  length_ = step_pos0_ + step_n_;
}

}  // namespace kvscope::generate
