// Device-side reads of the paged cache (kernels_cuda.h, PagedHeads) and the
// small reductions the attention kernels share.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant_int4.h"
#include "kernels/softmax_rules.h"

namespace kvscope::kernels::cuda::detail {

constexpr float kNegInf = -INFINITY;

// Where row i of kv head h lives.
struct RowRef {
  int64_t page;
  int64_t slot;
};

__device__ inline int64_t head_rows(const PagedHeads& H, int64_t h) {
  return H.row_begin[h + 1] - H.row_begin[h];
}

__device__ inline RowRef row_ref(const PagedHeads& H, int64_t h, int64_t i) {
  return {H.page_begin[h] + i / H.page_rows, i % H.page_rows};
}

// Value d of row `slot` of an INT4 page (codes, params), dequantised exactly
// as kernels/cpu/quant_int4_cpu.cpp does: lo + scale * q, multiply then add,
// each rounded (no fused multiply-add), so the same floats.
__device__ inline float int4_value(const uint8_t* codes, const float* params, int64_t hd,
                                   int64_t slot, int64_t d) {
  const int64_t gs = int4_group_size(hd), groups = hd / gs;
  const uint8_t c = codes[slot * (hd / 2) + d / 2];
  const float* p = params + slot * groups * 2 + (d / gs) * 2;
  return __fadd_rn(p[1], __fmul_rn(p[0], float((d & 1) ? (c >> 4) : (c & 0x0F))));
}

__device__ inline float int4_at(const uint8_t* const* codes, const float* const* params, int64_t hd,
                                RowRef r, int64_t d) {
  return int4_value(codes[r.page], params[r.page], hd, r.slot, d);
}

// A stored 16-bit float widened to float32 (exact), as the CPU kernels do.
__device__ inline float half_bits_to_float(uint16_t b, int kind) {
  return kind == kHalfBF16 ? __uint_as_float(uint32_t(b) << 16) : __half2float(__ushort_as_half(b));
}

__device__ inline float key_at(const PagedHeads& H, RowRef r, int64_t d) {
  if (H.k_codes) return int4_at(H.k_codes, H.k_params, H.head_dim, r, d);
  if (H.k_half) return half_bits_to_float(H.k_half[r.page][r.slot * H.head_dim + d], H.half_kind);
  return H.k_pages[r.page][r.slot * H.head_dim + d];
}

__device__ inline float value_at(const PagedHeads& H, RowRef r, int64_t d) {
  if (H.v_codes) return int4_at(H.v_codes, H.v_params, H.head_dim, r, d);
  if (H.v_half) return half_bits_to_float(H.v_half[r.page][r.slot * H.head_dim + d], H.half_kind);
  return H.v_pages[r.page][r.slot * H.head_dim + d];
}

// Butterfly sum and max over a warp: every lane ends with the result, and
// the order of the additions is fixed.
__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// First index i in [0, n) of head h's position-sorted rows whose position is
// >= pos (n when none).
__device__ inline int64_t first_sorted_at(const PagedHeads& H, const int64_t* sorted_rows,
                                          int64_t h, int64_t n, int64_t pos) {
  const int64_t base = H.row_begin[h];
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (H.key_pos[base + sorted_rows[base + mid]] < pos)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

inline unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace kvscope::kernels::cuda::detail
