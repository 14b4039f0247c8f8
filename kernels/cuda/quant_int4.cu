// CUDA twin of the INT4 group quantisation (kernels/quant_int4.h): one thread
// per group, identical arithmetic to the CPU version.
#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant_int4.h"

namespace kvscope::kernels::cuda {

namespace {

__global__ void quantize_kernel(const float* x, int64_t n_groups, int64_t gs, uint8_t* codes,
                                float* params) {
  int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (g >= n_groups) return;
  const float* xg = x + g * gs;
  float lo = xg[0], hi = xg[0];
  for (int64_t i = 1; i < gs; ++i) {
    lo = fminf(lo, xg[i]);
    hi = fmaxf(hi, xg[i]);
  }
  float scale = (hi - lo) / 15.0f;
  float inv = scale > 0 ? 1.0f / scale : 0.0f;
  params[2 * g] = scale;
  params[2 * g + 1] = lo;
  for (int64_t i = 0; i < gs; i += 2) {
    int a = min(15, max(0, int(roundf((xg[i] - lo) * inv))));  // half away from 0, as lround
    int b = min(15, max(0, int(roundf((xg[i + 1] - lo) * inv))));
    codes[(g * gs + i) / 2] = static_cast<uint8_t>(a | (b << 4));
  }
}

__global__ void dequantize_kernel(const uint8_t* codes, const float* params, int64_t n_groups,
                                  int64_t gs, float* x) {
  int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (g >= n_groups) return;
  const float scale = params[2 * g], lo = params[2 * g + 1];
  for (int64_t i = 0; i < gs; i += 2) {
    uint8_t c = codes[(g * gs + i) / 2];
    // Unfused, as the CPU's lo + scale * q (see paged_rows.cuh).
    x[g * gs + i] = __fadd_rn(lo, __fmul_rn(scale, float(c & 0x0F)));
    x[g * gs + i + 1] = __fadd_rn(lo, __fmul_rn(scale, float(c >> 4)));
  }
}

}  // namespace

int quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params,
                  void* stream) {
  int64_t groups = rows * int4_groups(hd);
  unsigned blocks = static_cast<unsigned>((groups + 255) / 256);
  quantize_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, groups, int4_group_size(hd), codes, params);
  return static_cast<int>(cudaGetLastError());
}

int dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd, float* x,
                    void* stream) {
  int64_t groups = rows * int4_groups(hd);
  unsigned blocks = static_cast<unsigned>((groups + 255) / 256);
  dequantize_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(codes, params, groups,
                                                                           int4_group_size(hd), x);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvscope::kernels::cuda
