// Attention kernels of the KV caches. Both caches (the dense one of the plain
// engine and the ragged, policy-shaped one of `kvscope capture`) call these
// and nothing else, so a ragged cache holding every entry computes exactly the
// numbers the dense one computes.
//
// Shapes are for ONE key/value head and the R query heads that share it
// (grouped-query attention); callers loop over kv heads, so no T x T matrix
// is ever materialised for all heads at once.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/softmax_rules.h"

namespace kvscope::kernels {

// key_visible (the visibility rule) lives in kernels/softmax_rules.h.

// Receives the attention weights one block of queries at a time, while the
// block is still in cache, so statistics never need the whole [R, n, m]
// matrix: p is [R, b, mk] row-major (row r * b + i: query head r, query
// i0 + i) over keys k0 .. k0 + mk - 1 of the call. Every key outside the
// block weighs 0 for these queries. Blocks arrive in query order and cover
// each query once.
using BlockSink =
    std::function<void(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0)>;

// Many queries (prefill chunk): q [R, n, hd] at positions q_pos0 .. q_pos0+n-1,
// keys/values [m, hd] with positions key_pos [m] (int64, any order).
// Returns out [R, n, hd]. When probs is non-null it receives the post-softmax
// weights [R, n, m] (float32); when sink is non-null it receives them block
// by block. `allowed` (bool [n, m], may be null) hides further keys from
// queries (read-time selection). Matrix products go through BLAS.
torch::Tensor attention_multi(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& key_pos, int64_t q_pos0,
                              double scale, int64_t window, torch::Tensor* probs,
                              const torch::Tensor* allowed = nullptr,
                              const BlockSink* sink = nullptr);

// attention_multi for the kv heads of a layer (no probs, mask or sink):
// q[h] [R, n, hd], k[h] and v[h] [m, hd], keys at key_pos for every head.
// With OpenBLAS and more than one kernel thread, the (head, query block)
// pairs run on the kernel threads, each with single-threaded BLAS (so the
// softmax between the products runs on every core too); otherwise one head
// after another. The same numbers either way.
std::vector<torch::Tensor> attention_multi_heads(const std::vector<torch::Tensor>& q,
                                                 const std::vector<torch::Tensor>& k,
                                                 const std::vector<torch::Tensor>& v,
                                                 const torch::Tensor& key_pos, int64_t q_pos0,
                                                 double scale, int64_t window);

// How a segment's rows are stored: float32, or 16-bit floats (bfloat16,
// IEEE half) that the kernels widen to float32 as they read them. Widening
// is exact, so rows read as bf16 give the bits the same rows widened into a
// float32 copy give (accumulation is float32 either way).
enum class RowType : uint8_t { F32, BF16, F16 };
inline int64_t row_type_bytes(RowType t) {
  return t == RowType::F32 ? 4 : 2;
}

// Rows of K and V stored in one contiguous run: keys at k + i * stride,
// values at v + i * stride (in elements of `type`), i < rows. A ragged cache
// passes one segment per page, a dense cache one segment for everything.
struct Segment {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t rows = 0;
  int64_t stride = 0;  // elements between consecutive rows
  RowType type = RowType::F32;
};

// Adds the column sums of a row-major [rows, cols] float matrix into
// out[cols]: the attention mass each key receives from a block of query
// rows. Rows are added in order, so each sum equals a column walked top to
// bottom onto out, but memory is read sequentially (a column walk strides by
// cols floats: a cache miss per element for a prefill chunk's [R * n, keys]).
void sum_rows_add(const float* p, int64_t rows, int64_t cols, float* out);

// One query (decode): q [R, hd] (float32, contiguous) at position q_pos over
// the rows of the segments in order, whose positions are key_pos (one per
// row). out [R, hd] is written; probs (size R * rows, may be null) receives
// the weights, row-major [R, rows]. Rows not visible get weight 0; a query
// seeing no row gets zeros. Plain C++ loops over chunks of rows, split over
// the kernel threads (kernels/parallel.h) with results independent of them.
void attention_decode_segments(const float* q, int64_t R, int64_t hd,
                               const std::vector<Segment>& segments, const int64_t* key_pos,
                               int64_t q_pos, double scale, int64_t window, float* out,
                               float* probs);

// One kv head's share of a decode step, for attention_decode_heads.
struct DecodeHead {
  const float* q;                        // [R, hd]
  const std::vector<Segment>* segments;  // its rows, in order
  const int64_t* key_pos;                // one per row
  float* out;                            // [R, hd]
  float* probs;                          // [R, rows] or null
};

// attention_decode_segments for several kv heads at once (one split over the
// threads instead of one per head; the same numbers).
void attention_decode_heads(const DecodeHead* heads, int64_t n_heads, int64_t R, int64_t hd,
                            int64_t q_pos, double scale, int64_t window);

}  // namespace kvscope::kernels
