// INT4 group quantisation of K/V rows for the warm tier: each group of
// kInt4Group consecutive values stores 4-bit codes q in [0, 15] with a float
// scale and minimum, x ~ min + scale * q (asymmetric, round to nearest).
// Two codes per byte, low nibble first.
#pragma once

#include <cstdint>

namespace kvscope::kernels {

inline constexpr int64_t kInt4Group = 32;

// Bytes of codes and number of (scale, min) pairs for a row of hd values.
inline int64_t int4_code_bytes(int64_t hd) { return hd / 2; }
inline int64_t int4_groups(int64_t hd) { return hd / kInt4Group; }

// rows x hd floats -> codes [rows, hd/2] and params [rows, groups, 2] (scale, min).
// hd must be a multiple of kInt4Group.
void quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params);
void dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd, float* x);

}  // namespace kvscope::kernels
