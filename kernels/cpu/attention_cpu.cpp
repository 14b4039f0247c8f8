#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention.h"

namespace kvscope::kernels {

namespace {

// One dense block: every query of q [R, n, hd] against every key of k [m, hd].
torch::Tensor attention_dense(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& key_pos, int64_t q_pos0,
                              double scale, int64_t window, torch::Tensor* probs,
                              const torch::Tensor* allowed) {
  const int64_t R = q.size(0), n = q.size(1), hd = q.size(2), m = k.size(0);
  torch::Tensor scores = torch::mm(q.reshape({R * n, hd}), k.t()).to(torch::kFloat32) * scale;
  // Additive mask [n, m] shared by the R heads of the group.
  torch::Tensor qpos =
      torch::arange(q_pos0, q_pos0 + n, torch::kInt64).to(key_pos.device()).unsqueeze(1);
  torch::Tensor kpos = key_pos.unsqueeze(0);
  torch::Tensor visible = kpos <= qpos;
  if (window > 0) visible = visible.logical_and(kpos > qpos - window);
  if (allowed) visible = visible.logical_and(*allowed);
  torch::Tensor mask =
      torch::zeros({n, m}, scores.options())
          .masked_fill_(visible.logical_not(), -std::numeric_limits<float>::infinity());
  scores = (scores.view({R, n, m}) + mask).view({R * n, m});
  torch::Tensor p = torch::softmax(scores, -1);
  torch::Tensor out = torch::mm(p.to(v.scalar_type()), v);
  if (probs) *probs = p.view({R, n, m});
  return out.view({R, n, hd});
}

// Query rows per block of a long prefill. A block multiplies only the keys its
// queries can see (a prefix, for keys in position order), so a causal prefill
// does about half the work of the full square, and its scores [R * 256, m]
// stay small. SmolLM2, 2048-token prompt, 2 threads: 300 prefill tokens/s in
// one forward, against 248 in 512-token chunks before (docs/performance.md).
constexpr int64_t kQueryBlock = 256;

bool ascending(const int64_t* pos, int64_t m) {
  for (int64_t i = 1; i < m; ++i)
    if (pos[i] < pos[i - 1]) return false;
  return true;
}

}  // namespace

torch::Tensor attention_multi(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& key_pos, int64_t q_pos0,
                              double scale, int64_t window, torch::Tensor* probs,
                              const torch::Tensor* allowed) {
  const int64_t R = q.size(0), n = q.size(1), hd = q.size(2), m = k.size(0);
  if (n <= kQueryBlock)  // one block: no positions to read (key_pos may live on a GPU)
    return attention_dense(q, k, v, key_pos, q_pos0, scale, window, probs, allowed);
  const torch::Tensor kp = key_pos.to(torch::kCPU).contiguous();
  const int64_t* pos = kp.data_ptr<int64_t>();
  if (!ascending(pos, m))
    return attention_dense(q, k, v, key_pos, q_pos0, scale, window, probs, allowed);
  torch::Tensor out = torch::empty({R, n, hd}, q.options().dtype(v.scalar_type()));
  if (probs) *probs = torch::zeros({R, n, m}, q.options().dtype(torch::kFloat32));
  for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
    const int64_t b = std::min(kQueryBlock, n - i0);
    // Keys visible to some query of the block: positions in
    // (first query - window, last query].
    const int64_t last = q_pos0 + i0 + b - 1;
    int64_t k1 = std::upper_bound(pos, pos + m, last) - pos;
    int64_t k0 = window > 0 ? std::upper_bound(pos, pos + m, q_pos0 + i0 - window) - pos : 0;
    if (k1 <= k0) k0 = 0, k1 = m;  // no key visible: the dense block says so
    torch::Tensor allowed_blk;
    if (allowed) allowed_blk = allowed->narrow(0, i0, b).narrow(1, k0, k1 - k0);
    torch::Tensor probs_blk;
    torch::Tensor o =
        attention_dense(q.narrow(1, i0, b), k.narrow(0, k0, k1 - k0), v.narrow(0, k0, k1 - k0),
                        key_pos.narrow(0, k0, k1 - k0), q_pos0 + i0, scale, window,
                        probs ? &probs_blk : nullptr, allowed ? &allowed_blk : nullptr);
    out.narrow(1, i0, b).copy_(o);
    if (probs) probs->narrow(1, i0, b).narrow(2, k0, k1 - k0).copy_(probs_blk);
  }
  return out;
}

namespace {

// Dot product with eight independent partial sums: vectorises without
// -ffast-math and sums in a fixed order (deterministic).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[d + j] * b[d + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

void attention_decode_segments(const float* q, int64_t R, int64_t hd,
                               const std::vector<Segment>& segments, const int64_t* key_pos,
                               int64_t q_pos, double scale, int64_t window, float* out,
                               float* probs) {
  int64_t rows = 0;
  for (const Segment& s : segments) rows += s.rows;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> w(static_cast<size_t>(rows));
    for (int64_t r = r0; r < r1; ++r) {
      const float* qr = q + r * hd;
      // Scores, in segment order.
      int64_t i = 0;
      float mx = neg_inf;
      for (const Segment& s : segments)
        for (int64_t j = 0; j < s.rows; ++j, ++i) {
          float x = key_visible(key_pos[i], q_pos, window)
                        ? dot(qr, s.k + j * s.stride, hd) * fscale
                        : neg_inf;
          w[size_t(i)] = x;
          mx = std::max(mx, x);
        }
      // Softmax (max-subtracted), then the weighted sum of values.
      float sum = 0;
      for (int64_t t = 0; t < rows; ++t) {
        float e = w[size_t(t)] == neg_inf ? 0.0f : std::exp(w[size_t(t)] - mx);
        w[size_t(t)] = e;
        sum += e;
      }
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      float* o = out + r * hd;
      std::fill(o, o + hd, 0.0f);
      i = 0;
      for (const Segment& s : segments)
        for (int64_t j = 0; j < s.rows; ++j, ++i) {
          const float p = w[size_t(i)] * inv;
          w[size_t(i)] = p;
          if (p == 0.0f) continue;
          const float* vr = s.v + j * s.stride;
          for (int64_t d = 0; d < hd; ++d) o[d] += p * vr[d];
        }
      if (probs) std::copy(w.begin(), w.end(), probs + r * rows);
    }
  });
}

void sum_rows(const float* p, int64_t rows, int64_t cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += row[j];
  }
}

}  // namespace kvscope::kernels
