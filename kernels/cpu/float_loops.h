// Small float loops shared by the CPU attention kernels. Written so GCC
// vectorises them without -ffast-math: fixed partial sums (the same order on
// every run, so results are deterministic) and no branches in the exp. The
// kernels are built with -fno-trapping-math (kernels/CMakeLists.txt), which
// lets GCC turn the exp's selects into vector blends; it changes no result.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

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

// exp(x) for x <= 0 (a score minus its row's maximum); -inf gives exactly 0.
// Cody-Waite reduction x = n ln2 + r and the degree-6 polynomial of Cephes'
// expf (relative error about 2e-7, a float's rounding), branch-free so loops
// over it vectorise; libm's expf is one call per element.
inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;  // 2^-126: the smallest normal scale
  // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x == kNegInf ? 0.0f : e * scale;
}

}  // namespace kvscope::kernels::cpu

// Hot loops are built twice, for AVX2+FMA and for the baseline ISA; GCC picks
// one when the program loads (every x86-64 CPU of the last decade takes the
// first; the second keeps the binary portable).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVSCOPE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVSCOPE_CPU_CLONES
#endif
