// Small float loops shared by the CPU attention kernels. Written so GCC
// vectorises them without -ffast-math: fixed partial sums (the same order on
// every run, so results are deterministic) and no branches in the exp. The
// kernels are built with -fno-trapping-math (kernels/CMakeLists.txt), which
// lets GCC turn the exp's selects into vector blends; it changes no result.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

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
