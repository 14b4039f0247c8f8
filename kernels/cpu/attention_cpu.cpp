#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/common/check.h"
#include "kernels/attention.h"
#include "kernels/cpu/float_loops.h"
#include "kernels/parallel.h"

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
  // A query's visible run of keys is the same for its R heads: found once.
  for (int64_t i = 0; i < b; ++i) {
    const int64_t qp = qpos0 + i;
    const int64_t hi = std::upper_bound(pos, pos + mk, qp) - pos;
    const int64_t lo =
        window > 0 ? std::min(hi, std::upper_bound(pos, pos + mk, qp - window) - pos) : 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t row = r * b + i;
      softmax_visible_row(s + row * mk, p + row * mk, mk, lo, hi,
                          allowed ? allowed + i * mk : nullptr);
    }
  }
}

// Keys [k0, k1) visible to some query of the block i0 .. i0 + b - 1: positions
// in (first query - window, last query]. None visible: all keys (every weight
// is then NaN, as a dense softmax says).
void block_keys(const int64_t* pos, int64_t m, int64_t qpos_first, int64_t b, int64_t window,
                int64_t* k0, int64_t* k1) {
  *k1 = std::upper_bound(pos, pos + m, qpos_first + b - 1) - pos;
  *k0 = window > 0 ? std::upper_bound(pos, pos + m, qpos_first - window) - pos : 0;
  if (*k1 <= *k0) *k0 = 0, *k1 = m;
}

// One block of queries i0 .. i0 + b - 1 over keys k0 .. k0 + mk - 1: one BLAS
// product, the softmax over each row's visible keys, one BLAS product with
// the values into rows i0.. of out. scores and weights hold at least
// R * b * mk floats; returns the weights [R * b, mk].
torch::Tensor attend_block(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const int64_t* pos, int64_t q_pos0, double scale, int64_t window,
                           const torch::Tensor* allowed, int64_t i0, int64_t b, int64_t k0,
                           int64_t mk, const torch::Tensor& scores, const torch::Tensor& weights,
                           torch::Tensor& out) {
  const int64_t R = q.size(0), hd = q.size(2);
  torch::Tensor s = scores.narrow(0, 0, R * b * mk).view({R * b, mk});
  // BLAS scales the finished dot products (alpha), as q.k * scale does.
  torch::addmm_out(s, s, q.narrow(1, i0, b).reshape({R * b, hd}), k.narrow(0, k0, mk).t(),
                   /*beta=*/0, /*alpha=*/scale);
  torch::Tensor ok;
  if (allowed) ok = allowed->narrow(0, i0, b).narrow(1, k0, mk).contiguous();
  torch::Tensor p = weights.narrow(0, 0, R * b * mk).view({R * b, mk});
  softmax_visible(s.data_ptr<float>(), p.data_ptr<float>(), R, b, mk, pos + k0, q_pos0 + i0, window,
                  allowed ? ok.data_ptr<bool>() : nullptr);
  out.narrow(1, i0, b).copy_(torch::mm(p, v.narrow(0, k0, mk)).view({R, b, hd}));
  return p;
}

// One kv head of a blocked prefill: its inputs and its output.
struct HeadJob {
  const torch::Tensor* q;
  const torch::Tensor* k;
  const torch::Tensor* v;
  const torch::Tensor* allowed;  // may be null
  torch::Tensor out;             // [R, n, hd]
};

// The (head, query block) items of heads that share key positions, each on
// one kernel thread with single-threaded BLAS. Every block's numbers are
// therefore the same whichever path, thread count or head grouping computed
// it (OpenBLAS's multi-threaded products round differently from its
// single-threaded ones), and the softmax between the products runs on every
// core. Measured on SmolLM2's 2048-token prefill (5 alternating rounds):
// best / median 575 / 530 tokens/s against 506 / 448 with each head's
// products on OpenBLAS's two threads. `deliver(head, i0, b, weights, k0, k1)`,
// when set, receives each block's weights in (head, block) order: items then
// run in waves of one per kernel thread, each with its own buffers. Without
// it, each thread keeps its score buffers (thread_local, the size of the
// largest block it has run) for the next call.
class BlockedPrefill {
 public:
  using Deliver = std::function<void(int64_t head, int64_t i0, int64_t b, const torch::Tensor& p,
                                     int64_t k0, int64_t k1)>;

  BlockedPrefill(std::vector<HeadJob>& heads, const int64_t* pos, int64_t m, int64_t q_pos0,
                 double scale, int64_t window)
      : heads_(heads), pos_(pos), m_(m), q_pos0_(q_pos0), scale_(scale), window_(window) {
    n_ = heads[0].q->size(1);
    blocks_ = (n_ + kQueryBlock - 1) / kQueryBlock;
  }

  void run(const Deliver* deliver) {
    const BlasThreadsScope one_blas_thread(1);
    const int64_t items = int64_t(heads_.size()) * blocks_;
    if (!deliver) {
      // The blocks seeing the most keys first, so the last items are short.
      parallel_items(items, [&](int64_t i) {
        thread_local Buffers buf;
        compute(int64_t(heads_.size()) - 1 - i % int64_t(heads_.size()),
                blocks_ - 1 - i / int64_t(heads_.size()), buf);
      });
      return;
    }
    const int64_t wave = kernel_threads();
    std::vector<Buffers> bufs(static_cast<size_t>(wave));
    for (int64_t w0 = 0; w0 < items; w0 += wave) {
      const int64_t count = std::min(wave, items - w0);
      parallel_items(count, [&](int64_t j) {
        compute((w0 + j) / blocks_, (w0 + j) % blocks_, bufs[size_t(j)]);
      });
      for (int64_t j = 0; j < count; ++j) {
        const Buffers& b = bufs[size_t(j)];
        (*deliver)((w0 + j) / blocks_, b.i0, b.b, b.p, b.k0, b.k1);
      }
    }
  }

 private:
  struct Buffers {
    torch::Tensor scores, weights, p;
    int64_t i0 = 0, b = 0, k0 = 0, k1 = 0;
  };

  void compute(int64_t h, int64_t block, Buffers& buf) {
    const HeadJob& job = heads_[size_t(h)];
    buf.i0 = block * kQueryBlock;
    buf.b = std::min(kQueryBlock, n_ - buf.i0);
    block_keys(pos_, m_, q_pos0_ + buf.i0, buf.b, window_, &buf.k0, &buf.k1);
    const int64_t need = job.q->size(0) * buf.b * (buf.k1 - buf.k0);
    if (!buf.scores.defined() || buf.scores.numel() < need) {
      buf.scores = torch::empty({need}, job.q->options());
      buf.weights = torch::empty({need}, job.q->options());
    }
    buf.p = attend_block(*job.q, *job.k, *job.v, pos_, q_pos0_, scale_, window_, job.allowed,
                         buf.i0, buf.b, buf.k0, buf.k1 - buf.k0, buf.scores, buf.weights,
                         heads_[size_t(h)].out);
  }

  std::vector<HeadJob>& heads_;
  const int64_t* pos_;
  int64_t m_, q_pos0_;
  double scale_;
  int64_t window_;
  int64_t n_ = 0, blocks_ = 0;
};

// float32 on the CPU, keys in position order: per block of query rows, one
// BLAS product over the keys the block can see, a softmax over each row's
// visible keys into a second buffer, one BLAS product with the values
// (BlockedPrefill). No additive mask or scaled copy of the scores is made.
torch::Tensor attention_blocked_cpu(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const int64_t* pos, int64_t q_pos0,
                                    double scale, int64_t window, torch::Tensor* probs,
                                    const torch::Tensor* allowed, const BlockSink* sink) {
  const int64_t R = q.size(0), n = q.size(1), hd = q.size(2), m = k.size(0);
  std::vector<HeadJob> heads{{&q, &k, &v, allowed, torch::empty({R, n, hd}, q.options())}};
  // Each block writes its own rows of probs once: the weights over its keys,
  // zeros elsewhere (zeros() first would write every byte twice).
  if (probs) *probs = torch::empty({R, n, m}, q.options());
  const BlockedPrefill::Deliver deliver = [&](int64_t, int64_t i0, int64_t b,
                                              const torch::Tensor& p, int64_t k0, int64_t k1) {
    if (sink) (*sink)(p.data_ptr<float>(), b, k1 - k0, i0, k0);
    if (probs) {
      torch::Tensor rows_blk = probs->narrow(1, i0, b);
      rows_blk.narrow(2, k0, k1 - k0).copy_(p.view({R, b, k1 - k0}));
      if (k0 > 0) rows_blk.narrow(2, 0, k0).zero_();
      if (k1 < m) rows_blk.narrow(2, k1, m - k1).zero_();
    }
  };
  BlockedPrefill(heads, pos, m, q_pos0, scale, window).run(sink || probs ? &deliver : nullptr);
  return heads[0].out;
}

bool blocked_path_ok(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& key_pos) {
  const auto f32_cpu = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
  };
  const bool grad = torch::GradMode::is_enabled() &&
                    (q.requires_grad() || k.requires_grad() || v.requires_grad());
  // autograd cannot go through out= products
  return !grad && f32_cpu(q) && f32_cpu(k) && f32_cpu(v) && key_pos.device().is_cpu();
}

}  // namespace

torch::Tensor attention_multi(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& key_pos, int64_t q_pos0,
                              double scale, int64_t window, torch::Tensor* probs,
                              const torch::Tensor* allowed, const BlockSink* sink) {
  KVSCOPE_CHECK(q.dim() == 3 && k.dim() == 2 && v.dim() == 2,
                "attention_multi: q [R, n, hd], k and v [m, hd]");
  KVSCOPE_CHECK(k.size(0) == v.size(0) && key_pos.numel() == k.size(0) && q.size(2) == k.size(1),
                "attention_multi: one position per key row, queries and keys of one head_dim");
  KVSCOPE_CHECK(!allowed || (allowed->size(0) == q.size(1) && allowed->size(1) == k.size(0)),
                "attention_multi: the selection mask is [queries, keys]");
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
  if (!blocked_path_ok(q, k, v, key_pos)) return dense();
  const torch::Tensor kp = key_pos.contiguous();
  const int64_t* pos = kp.data_ptr<int64_t>();
  if (!ascending(pos, k.size(0))) return dense();
  return attention_blocked_cpu(q, k, v, pos, q_pos0, scale, window, probs, allowed, sink);
}

std::vector<torch::Tensor> attention_multi_heads(const std::vector<torch::Tensor>& q,
                                                 const std::vector<torch::Tensor>& k,
                                                 const std::vector<torch::Tensor>& v,
                                                 const torch::Tensor& key_pos, int64_t q_pos0,
                                                 double scale, int64_t window) {
  const int64_t K = int64_t(q.size());
  const torch::Tensor kp = key_pos.contiguous();
  bool blocked = kp.device().is_cpu() && ascending(kp.data_ptr<int64_t>(), kp.numel());
  for (int64_t h = 0; h < K && blocked; ++h)
    blocked = blocked_path_ok(q[size_t(h)], k[size_t(h)], v[size_t(h)], kp);
  std::vector<torch::Tensor> outs;
  if (!blocked) {
    for (int64_t h = 0; h < K; ++h)
      outs.push_back(attention_multi(q[size_t(h)], k[size_t(h)], v[size_t(h)], kp, q_pos0, scale,
                                     window, nullptr));
    return outs;
  }
  const int64_t R = q[0].size(0), n = q[0].size(1), hd = q[0].size(2);
  std::vector<HeadJob> heads;
  for (int64_t h = 0; h < K; ++h)
    heads.push_back({&q[size_t(h)], &k[size_t(h)], &v[size_t(h)], nullptr,
                     torch::empty({R, n, hd}, q[0].options())});
  BlockedPrefill(heads, kp.data_ptr<int64_t>(), kp.numel(), q_pos0, scale, window).run(nullptr);
  for (HeadJob& h : heads) outs.push_back(h.out);
  return outs;
}

void sum_rows_add(const float* p, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] += row[j];
  }
}

}  // namespace kvscope::kernels
