// Small float loops shared by the CPU attention kernels. Written so GCC
// vectorises them without -ffast-math: fixed partial sums (the same order on
// every run, so results are deterministic) and no branches in the exp. The
// kernels are built with -fno-trapping-math (kernels/CMakeLists.txt), which
// lets GCC turn the exp's selects into vector blends; it changes no result.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention.h"
#include "kernels/softmax_rules.h"

namespace kvscope::kernels::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Dot product with eight independent partial sums.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = n / 8 * 8;
  for (int64_t d = 0; d < full; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[d + j] * b[d + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t d = full; d < n; ++d) s += a[d] * b[d];
  return s;
}

// Elements of a stored row, widened to float32 (exactly) as they are read.
struct F32Elems {
  static float at(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct BF16Elems {  // bfloat16: the top 16 bits of a float32
  static float at(const void* p, int64_t i) {
    const uint32_t u = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};
struct F16Elems {  // IEEE half (c10's branch-free conversion)
  static float at(const void* p, int64_t i) {
    return c10::detail::fp16_ieee_to_fp32_value(static_cast<const uint16_t*>(p)[i]);
  }
};

// dot() with b a stored row of any element type: the same partial sums in
// the same order, so a bf16 row gives the bits its float32 widening gives.
template <class Elems>
inline float dot_elems(const float* a, const void* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = n / 8 * 8;
  for (int64_t d = 0; d < full; d += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[d + j] * Elems::at(b, d + j);
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t d = full; d < n; ++d) s += a[d] * Elems::at(b, d);
  return s;
}

inline float dot_row(const float* a, const void* b, RowType type, int64_t n) {
  switch (type) {
    case RowType::BF16: return dot_elems<BF16Elems>(a, b, n);
    case RowType::F16: return dot_elems<F16Elems>(a, b, n);
    case RowType::F32: break;
  }
  return dot(a, static_cast<const float*>(b), n);
}

// out[d] += p * v[d] for a stored row v of any element type.
template <class Elems>
inline void add_scaled_elems(float* out, float p, const void* v, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] += p * Elems::at(v, d);
}
inline void add_scaled_row(float* out, float p, const void* v, RowType type, int64_t n) {
  switch (type) {
    case RowType::BF16: return add_scaled_elems<BF16Elems>(out, p, v, n);
    case RowType::F16: return add_scaled_elems<F16Elems>(out, p, v, n);
    case RowType::F32: break;
  }
  add_scaled_elems<F32Elems>(out, p, v, n);
}

// Sum with eight partial sums.
inline float sum8(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = n / 8 * 8;
  for (int64_t i = 0; i < full; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t i = full; i < n; ++i) s += x[i];
  return s;
}

// Largest element (kNegInf for n = 0), eight lanes at a time. GCC will not
// vectorise a max reduction written as a loop without -ffast-math, so the
// lanes are a GCC vector type (two SSE registers on the baseline ISA).
inline float max8(const float* x, int64_t n) {
  typedef float v8f __attribute__((vector_size(32)));
  v8f acc = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  const int64_t full = n / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) {
    v8f v;
    std::memcpy(&v, x + i, sizeof v);
    acc = acc > v ? acc : v;
  }
  float m = kNegInf;
  for (int j = 0; j < 8; ++j) m = m > acc[j] ? m : acc[j];
  for (int64_t i = full; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

// The softmax's exp (kernels/softmax_rules.h), shared with the CUDA kernels.
using kernels::exp_nonpositive;

}  // namespace kvscope::kernels::cpu

// Hot loops are built twice, for AVX2+FMA and for the baseline ISA; GCC picks
// one when the program loads (every x86-64 CPU of the last decade takes the
// first; the second keeps the binary portable).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVSCOPE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVSCOPE_CPU_CLONES
#endif
