#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention.h"
#include "kernels/cpu/float_loops.h"

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

// Softmax of the rows of one block's scores s (R heads x b queries x mk
// keys, row-major, query i at position qpos0 + i) into p, over the keys each
// query may see: inside its causal window (a contiguous run of the keys,
// which are in position order) and allowed by the selection mask (bool
// [b, mk], may be null). Hidden keys weigh 0; a query that sees no key gets
// NaN weights, as a dense softmax over -inf scores gives. One pass reads
// the scores and writes the weights (a separate hide pass and LibTorch's
// softmax were two).
KVSCOPE_CPU_CLONES void softmax_visible_row(const float* x, float* y, int64_t mk, int64_t lo,
                                            int64_t hi, const bool* ok) {
  float mx = cpu::kNegInf;
  if (!ok) {
    mx = cpu::max8(x + lo, hi - lo);
  } else {
    for (int64_t j = lo; j < hi; ++j)
      if (ok[j]) mx = std::max(mx, x[j]);
  }
  if (mx == cpu::kNegInf) {
    std::fill(y, y + mk, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  std::fill(y, y + lo, 0.0f);
  std::fill(y + hi, y + mk, 0.0f);
  if (ok) {
    for (int64_t j = lo; j < hi; ++j) y[j] = ok[j] ? cpu::exp_nonpositive(x[j] - mx) : 0.0f;
  } else {
    for (int64_t j = lo; j < hi; ++j) y[j] = cpu::exp_nonpositive(x[j] - mx);
  }
  const float inv = 1.0f / cpu::sum8(y + lo, hi - lo);
  for (int64_t j = lo; j < hi; ++j) y[j] *= inv;
}

// The block softmax runs on the calling thread. Split over the kernel
// threads (rows in items of 16) it measured slower in the engine: 2048-token
// SmolLM2 prefill, 5 alternating rounds, best / median 463 / 345 tokens/s
// against 506 / 468 on one thread. A worker waking between two OpenBLAS
// products takes the second core from OpenBLAS's worker, and OpenBLAS's
// static split then waits for it.
void softmax_visible(const float* s, float* p, int64_t R, int64_t b, int64_t mk, const int64_t* pos,
                     int64_t qpos0, int64_t window, const bool* allowed) {
  for (int64_t row = 0; row < R * b; ++row) {
    const int64_t i = row % b, qp = qpos0 + i;
    const int64_t hi = std::upper_bound(pos, pos + mk, qp) - pos;
    const int64_t lo =
        window > 0 ? std::min(hi, std::upper_bound(pos, pos + mk, qp - window) - pos) : 0;
    softmax_visible_row(s + row * mk, p + row * mk, mk, lo, hi,
                        allowed ? allowed + i * mk : nullptr);
  }
}

// float32 on the CPU, keys in position order: per block of query rows, one
// BLAS product over the keys the block can see, a softmax over each row's
// visible keys into a second buffer, one BLAS product with the values. Buffers are reused across
// blocks, and no additive mask or scaled copy of the scores is made.
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
    torch::Tensor p = weights.narrow(0, 0, R * b * mk).view({R * b, mk});
    softmax_visible(s.data_ptr<float>(), p.data_ptr<float>(), R, b, mk, pos + k0, q_pos0 + i0,
                    window, allowed ? ok.data_ptr<bool>() : nullptr);
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

void sum_rows_add(const float* p, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += row[j];
  }
}

}  // namespace kvscope::kernels
