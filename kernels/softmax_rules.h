// The two rules every attention kernel shares, CPU and CUDA alike: which keys
// a query may see, and the exp of the softmax. Both compile for the host and,
// under nvcc, for the device, so a CUDA kernel and its CPU twin cannot drift
// apart on either.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvscope::kernels {

// Which keys a query may see: causal by position, within the model's sliding
// window (0: none).
KVSCOPE_HOST_DEVICE inline bool key_visible(int64_t key_pos, int64_t query_pos, int64_t window) {
  return key_pos <= query_pos && (window <= 0 || key_pos > query_pos - window);
}

// exp(x) for x <= 0 (a score minus its row's maximum); -inf gives exactly 0.
// Cody-Waite reduction x = n ln2 + r and the degree-6 polynomial of Cephes'
// expf (relative error about 2e-7, a float's rounding), branch-free so CPU
// loops over it vectorise; libm's expf is one call per element. The CUDA
// kernels use it too: the same weights to a float's rounding, not two
// definitions of the softmax.
KVSCOPE_HOST_DEVICE inline float exp_nonpositive(float x) {
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
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(bits);
#else
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
#endif
  return x == -INFINITY ? 0.0f : e * scale;
}

}  // namespace kvscope::kernels
