// CUDA twins of the CPU attention kernels, as raw-pointer launchers on device
// memory (no LibTorch types: the engine hands them tensor data pointers, and
// the parity tests and benchmarks build without LibTorch). They share the
// visibility rule and the softmax's exp with the CPU kernels
// (kernels/softmax_rules.h). Every launcher returns a cudaError_t as int and
// runs on `stream` (a cudaStream_t; null: the default stream).
//
// Determinism: no atomics; every sum runs in a fixed order (by row, by query,
// by query head), so the same inputs give the same bits on the same GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvscope::kernels::cuda {

// The largest group of query heads per kv head (R) and head width (hd) the
// kernels take.
inline constexpr int64_t kMaxGroup = 16;
inline constexpr int64_t kMaxHeadDim = 256;

// One layer of the ragged paged cache, as the kernels read it. kv head h
// holds rows row_begin[h] .. row_begin[h + 1] - 1 (its held entries, in slot
// order: positions in any order), in pages page_begin[h] .. of page_rows rows
// each: its row i lies in page page_begin[h] + i / page_rows, slot
// i % page_rows. All arrays are device memory.
struct PagedHeads {
  int64_t n_heads = 0;                  // kv heads K
  int64_t head_dim = 0;                 // hd (even; at most kMaxHeadDim)
  int64_t page_rows = 0;                // rows per page
  int64_t max_rows = 0;                 // the most rows any head holds (sizes the grids)
  const int64_t* row_begin = nullptr;   // [K + 1]
  const int64_t* page_begin = nullptr;  // [K + 1]
  const int64_t* key_pos = nullptr;     // [rows of all heads]: each row's position
  // Float pages (the hot tier): page p holds [page_rows, hd] keys / values.
  const float* const* k_pages = nullptr;
  const float* const* v_pages = nullptr;
  // INT4 pages (the warm tier, kernels/quant_int4.h), used when k_codes is
  // set: codes [page_rows, hd / 2] and params [page_rows, groups, 2]; the
  // kernels dequantise each value as they read it.
  const uint8_t* const* k_codes = nullptr;
  const float* const* k_params = nullptr;
  const uint8_t* const* v_codes = nullptr;
  const float* const* v_params = nullptr;
  // 16-bit float pages (--kv-dtype bf16 / fp16), used when k_half is set:
  // page p holds [page_rows, hd] keys / values; the kernels widen each
  // value to float32 as they read it (exact) and accumulate in float32.
  const uint16_t* const* k_half = nullptr;
  const uint16_t* const* v_half = nullptr;
  int half_kind = 0;  // 1: bfloat16, 2: IEEE half
};
inline constexpr int kHalfBF16 = 1;
inline constexpr int kHalfF16 = 2;

// Decode: one query per query head, q [K, R, hd] at position q_pos, over each
// kv head's rows. Split by chunks of 256 rows as attention_decode_segments
// (kernels/attention.h) is, combined in chunk order.
//   out       [K, R, hd]
//   probs     weights, head h's [R, rows_h] block at R * row_begin[h]
//             (always written: it holds the weights between the passes)
//   received  [rows of all heads]: the weight each row received, summed over
//             the group's query heads in order (null: not computed)
//   scratch   decode_scratch_floats(...) floats
struct DecodeOutputs {
  float* out = nullptr;
  float* probs = nullptr;
  float* received = nullptr;
  float* scratch = nullptr;
};
size_t decode_scratch_floats(int64_t n_heads, int64_t R, int64_t hd, int64_t max_rows);
int decode_attention(const float* q, int64_t R, const PagedHeads& heads, int64_t q_pos, float scale,
                     int64_t window, const DecodeOutputs& outputs, void* stream);

// Pooled weights by key position: for weights w [R, rows_h] per kv head h
// (the layout of DecodeOutputs::probs), the sum and the largest weight of
// each (query head, key block of `block` positions): sum / max
// [K, R, n_blocks]. sorted_rows lists each head's rows (0-based within the
// head, at row_begin[h]) in ascending position order; a block's rows are
// added in that order. Positions are distinct within a head.
int pool_by_position(const float* probs, int64_t R, const PagedHeads& heads,
                     const int64_t* sorted_rows, int64_t block, int64_t n_blocks, float* sum,
                     float* max, void* stream);

// Prefill (a chunk of n queries at positions q_pos0 ..): q [K, R, n, hd].
// Flash-style: each block of queries streams the keys in tiles with an
// online softmax, so no [n, rows] matrix exists. out [K, R, n, hd];
// lse [K, R, n]: the log of each query's softmax denominator plus its
// largest score (-inf when it sees no key; its output is then zeros).
int prefill_attention(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                      float scale, int64_t window, float* out, float* lse, void* stream);

// Statistics of a prefill chunk from its lse, block by block as the CPU
// kernel's BlockSink streams them: each weight is recomputed as
// exp(score - lse), never stored.
// received [rows of all heads]: per row, the weights summed over query heads
// then queries (r outer, i inner).
int prefill_received(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                     float scale, int64_t window, const float* lse, float* received, void* stream);
// sum / max [K, R, q_blocks, n_blocks]: per query head, query block
// (positions (q_pos0 / block + qb) * block ..; q_blocks covers the chunk) and
// key block, the sum and the largest weight of the chunk's queries on the
// block's keys. sorted_rows as for pool_by_position.
int64_t prefill_query_blocks(int64_t n, int64_t q_pos0, int64_t block);
int prefill_pooled(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                   const int64_t* sorted_rows, float scale, int64_t window, const float* lse,
                   int64_t block, int64_t n_blocks, float* sum, float* max, void* stream);

// INT4 group quantisation of rows (kernels/quant_int4.h), the same codes as
// the CPU's.
int quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params,
                  void* stream);
int dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd, float* x,
                    void* stream);

// "nvcc 13.0" (the compiler that built the kernels).
const char* build_info();

}  // namespace kvscope::kernels::cuda
