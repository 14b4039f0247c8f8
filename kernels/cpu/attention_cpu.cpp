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

// Query rows per block. A block multiplies only the keys its queries can see
// (a prefix, for keys in position order), so a causal prefill does about half
// the work of the full square. Blocks of 64, 128 and 256 measured the same
// (bench_kernels: one kv head, 2048 tokens, 17-19 ms each); 64 keeps the two
// score buffers [R * 64, m] small at long contexts (R = 3, 32K keys: 25 MB
// each, against 100 MB at 256).
constexpr int64_t kQueryBlock = 64;

bool ascending(const int64_t* pos, int64_t m) {
  for (int64_t i = 1; i < m; ++i)
    if (pos[i] < pos[i - 1]) return false;
  return true;
}

// Hides, in the scores of one block (R heads x b queries x mk keys, row-major,
// query i at position qpos0 + i), every key the query may not see: outside
// the causal window (a contiguous run of the keys, which are in position
// order) or not allowed by the selection mask (bool [b, mk], may be null).
// Touches only the hidden scores; the additive-mask tensor it replaces cost a
// full read and write of the block.
void hide_invisible(float* s, int64_t R, int64_t b, int64_t mk, const int64_t* pos, int64_t qpos0,
                    int64_t window, const bool* allowed) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t qp = qpos0 + i;
    const int64_t hi = std::upper_bound(pos, pos + mk, qp) - pos;
    const int64_t lo = window > 0 ? std::upper_bound(pos, pos + mk, qp - window) - pos : 0;
    const bool* ok = allowed ? allowed + i * mk : nullptr;
    for (int64_t r = 0; r < R; ++r) {
      float* row = s + (r * b + i) * mk;
      std::fill(row, row + lo, neg_inf);  // lo <= hi: qp - window < qp
      std::fill(row + hi, row + mk, neg_inf);
      if (ok)
        for (int64_t j = lo; j < hi; ++j)
          if (!ok[j]) row[j] = neg_inf;
    }
  }
}

// float32 on the CPU, keys in position order: per block of query rows, one
// BLAS product over the keys the block can see, the hidden keys set to -inf
// in place, LibTorch's vectorised softmax into a second buffer, one BLAS
// product with the values. Buffers are reused across blocks, and no additive
// mask or scaled copy of the scores is made.
torch::Tensor attention_blocked_cpu(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const int64_t* pos, int64_t q_pos0,
                                    double scale, int64_t window, torch::Tensor* probs,
                                    const torch::Tensor* allowed, const BlockSink* sink) {
  const int64_t R = q.size(0), n = q.size(1), hd = q.size(2), m = k.size(0);
  torch::Tensor out = torch::empty({R, n, hd}, q.options());
  // Each block writes its own rows of probs once: the weights over its keys,
  // zeros elsewhere (zeros() first would write every byte twice).
  if (probs) *probs = torch::empty({R, n, m}, q.options());
  const int64_t rows = R * std::min(kQueryBlock, n);
  torch::Tensor scores = torch::empty({rows * m}, q.options());
  torch::Tensor weights = torch::empty({rows * m}, q.options());
  for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
    const int64_t b = std::min(kQueryBlock, n - i0);
    // Keys visible to some query of the block: positions in
    // (first query - window, last query].
    int64_t k1 = std::upper_bound(pos, pos + m, q_pos0 + i0 + b - 1) - pos;
    int64_t k0 = window > 0 ? std::upper_bound(pos, pos + m, q_pos0 + i0 - window) - pos : 0;
    if (k1 <= k0) k0 = 0, k1 = m;  // no key visible: every weight is NaN, as a dense softmax says
    const int64_t mk = k1 - k0;
    torch::Tensor s = scores.narrow(0, 0, R * b * mk).view({R * b, mk});
    // BLAS scales the finished dot products (alpha), as q.k * scale does.
    torch::addmm_out(s, s, q.narrow(1, i0, b).reshape({R * b, hd}), k.narrow(0, k0, mk).t(),
                     /*beta=*/0, /*alpha=*/scale);
    torch::Tensor ok;
    if (allowed) ok = allowed->narrow(0, i0, b).narrow(1, k0, mk).contiguous();
    hide_invisible(s.data_ptr<float>(), R, b, mk, pos + k0, q_pos0 + i0, window,
                   allowed ? ok.data_ptr<bool>() : nullptr);
    torch::Tensor p = weights.narrow(0, 0, R * b * mk).view({R * b, mk});
    torch::softmax_out(p, s, 1);
    out.narrow(1, i0, b).copy_(torch::mm(p, v.narrow(0, k0, mk)).view({R, b, hd}));
    if (sink) (*sink)(p.data_ptr<float>(), b, mk, i0, k0);
    if (probs) {
      torch::Tensor rows_blk = probs->narrow(1, i0, b);
      rows_blk.narrow(2, k0, mk).copy_(p.view({R, b, mk}));
      if (k0 > 0) rows_blk.narrow(2, 0, k0).zero_();
      if (k1 < m) rows_blk.narrow(2, k1, m - k1).zero_();
    }
  }
  return out;
}

}  // namespace

torch::Tensor attention_multi(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& key_pos, int64_t q_pos0,
                              double scale, int64_t window, torch::Tensor* probs,
                              const torch::Tensor* allowed, const BlockSink* sink) {
  // The general path hands the sink its whole matrix as one block.
  const auto dense = [&] {
    torch::Tensor all;
    torch::Tensor out = attention_dense(q, k, v, key_pos, q_pos0, scale, window,
                                        probs || sink ? &all : nullptr, allowed);
    if (sink) {
      const torch::Tensor host = all.to(torch::kCPU, torch::kFloat32).contiguous();
      (*sink)(host.data_ptr<float>(), q.size(1), k.size(0), 0, 0);
    }
    if (probs) *probs = all;
    return out;
  };
  const auto f32_cpu = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
  };
  const bool grad = torch::GradMode::is_enabled() &&
                    (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (grad || !(f32_cpu(q) && f32_cpu(k) && f32_cpu(v) && key_pos.device().is_cpu()))
    return dense();  // autograd cannot go through out= products
  const torch::Tensor kp = key_pos.contiguous();
  const int64_t* pos = kp.data_ptr<int64_t>();
  if (!ascending(pos, k.size(0))) return dense();
  return attention_blocked_cpu(q, k, v, pos, q_pos0, scale, window, probs, allowed, sink);
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

// One query head of a decode step: scores into w (rows), softmax, the
// weighted sum of values into o[hd]; w ends holding the weights.
void decode_one_head(const float* qr, int64_t hd, const std::vector<Segment>& segments,
                     const int64_t* key_pos, int64_t rows, int64_t q_pos, float scale,
                     int64_t window, float* w, float* o) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Scores, in segment order.
  int64_t i = 0;
  float mx = neg_inf;
  for (const Segment& s : segments)
    for (int64_t j = 0; j < s.rows; ++j, ++i) {
      float x = key_visible(key_pos[i], q_pos, window) ? dot(qr, s.k + j * s.stride, hd) * scale
                                                       : neg_inf;
      w[i] = x;
      mx = std::max(mx, x);
    }
  // Softmax (max-subtracted), then the weighted sum of values.
  float sum = 0;
  for (int64_t t = 0; t < rows; ++t) {
    float e = w[t] == neg_inf ? 0.0f : std::exp(w[t] - mx);
    w[t] = e;
    sum += e;
  }
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  std::fill(o, o + hd, 0.0f);
  i = 0;
  for (const Segment& s : segments)
    for (int64_t j = 0; j < s.rows; ++j, ++i) {
      const float p = w[i] * inv;
      w[i] = p;
      if (p == 0.0f) continue;
      const float* vr = s.v + j * s.stride;
      for (int64_t d = 0; d < hd; ++d) o[d] += p * vr[d];
    }
}

}  // namespace

void attention_decode_segments(const float* q, int64_t R, int64_t hd,
                               const std::vector<Segment>& segments, const int64_t* key_pos,
                               int64_t q_pos, double scale, int64_t window, float* out,
                               float* probs) {
  int64_t rows = 0;
  for (const Segment& s : segments) rows += s.rows;
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> w(static_cast<size_t>(rows));
    for (int64_t r = r0; r < r1; ++r) {
      decode_one_head(q + r * hd, hd, segments, key_pos, rows, q_pos, static_cast<float>(scale),
                      window, w.data(), out + r * hd);
      if (probs) std::copy(w.begin(), w.end(), probs + r * rows);
    }
  });
}

void sum_rows_add(const float* p, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += row[j];
  }
}

}  // namespace kvscope::kernels
