// INT4 group quantisation of K/V rows for the warm tier: each group of
// int4_group_size(hd) consecutive values (kInt4Group = 32, or the whole row
// when the head is narrower than that or not a multiple of it) stores 4-bit codes q in [0, 15] with
// a float scale and minimum, x ~ min + scale * q (asymmetric, round to nearest). Two codes per
// byte, low nibble first.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace kvscope::kernels {

inline constexpr int64_t kInt4Group = 32;

// Bytes of codes and number of (scale, min) pairs for a row of hd values.
// A row of hd values splits into groups of 32, or is one group when hd is
// not a multiple of 32 (stories260K's heads are 8 wide); hd must be even.
KVSCOPE_HOST_DEVICE inline int64_t int4_group_size(int64_t hd) {
  return hd % kInt4Group == 0 ? kInt4Group : hd;
}
KVSCOPE_HOST_DEVICE inline int64_t int4_code_bytes(int64_t hd) {
  return hd / 2;
}
KVSCOPE_HOST_DEVICE inline int64_t int4_groups(int64_t hd) {
  return hd / int4_group_size(hd);
}

// rows x hd floats -> codes [rows, hd/2] and params [rows, groups, 2] (scale, min).
// hd must be even.
void quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params);
void dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd, float* x);

}  // namespace kvscope::kernels
