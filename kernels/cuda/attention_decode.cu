// CUDA twin of attention_decode_segments: one block per query head; threads
// stride over rows for the scores, reduce max and sum in shared memory, then
// accumulate the weighted values per dimension. Same visibility rule and the
// same max-subtracted softmax as the CPU kernel.
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda/kernels_cuda.h"

namespace kvscope::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ bool visible(int64_t key_pos, int64_t q_pos, int64_t window) {
  return key_pos <= q_pos && (window <= 0 || key_pos > q_pos - window);
}

__global__ void decode_kernel(const float* q, int64_t hd, const float* const* k_rows,
                              const float* const* v_rows, const int64_t* key_pos, int64_t rows,
                              int64_t q_pos, float scale, int64_t window, float* out, float* probs) {
  const int64_t r = blockIdx.x;
  const float* qr = q + r * hd;
  float* pr = probs + r * rows;
  __shared__ float red[kThreads];

  float local_max = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    float s = -FLT_MAX;
    if (visible(key_pos[i], q_pos, window)) {
      s = 0;
      for (int64_t d = 0; d < hd; ++d) s += qr[d] * k_rows[i][d];
      s *= scale;
    }
    pr[i] = s;
    local_max = fmaxf(local_max, s);
  }
  red[threadIdx.x] = local_max;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const float mx = red[0];
  __syncthreads();

  float local_sum = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    float e = pr[i] == -FLT_MAX ? 0.0f : __expf(pr[i] - mx);
    pr[i] = e;
    local_sum += e;
  }
  red[threadIdx.x] = local_sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = red[0] > 0 ? 1.0f / red[0] : 0.0f;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) pr[i] *= inv;
  __syncthreads();

  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0;
    for (int64_t i = 0; i < rows; ++i) acc += pr[i] * v_rows[i][d];
    out[r * hd + d] = acc;
  }
}

}  // namespace

int attention_decode_rows(const float* q, int64_t R, int64_t hd, const float* const* k_rows,
                          const float* const* v_rows, const int64_t* key_pos, int64_t rows,
                          int64_t q_pos, float scale, int64_t window, float* out, float* probs,
                          void* stream) {
  decode_kernel<<<static_cast<unsigned>(R), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, hd, k_rows, v_rows, key_pos, rows, q_pos, scale, window, out, probs);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvscope::kernels::cuda
