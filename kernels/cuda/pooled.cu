// Pooled weights by key position (kernels_cuda.h, pool_by_position): a
// thread per (kv head, query head, key block) finds the block's rows in the
// head's position-sorted rows by binary search and walks them in order, so
// the sums are deterministic without atomics.
#include <cuda_runtime.h>

#include "kernels/cuda/paged_rows.cuh"

namespace kvscope::kernels::cuda {

namespace {

using namespace detail;

__global__ void pool_kernel(const float* probs, int64_t R, PagedHeads H, const int64_t* sorted_rows,
                            int64_t block, int64_t n_blocks, float* sums, float* maxes) {
  const int64_t hr = blockIdx.y, h = hr / R, r = hr % R;
  const int64_t kb = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (kb >= n_blocks) return;
  const int64_t rows = head_rows(H, h), base = H.row_begin[h];
  const float* w = probs + R * base + r * rows;
  float s = 0.0f, x = 0.0f;
  for (int64_t i = first_sorted_at(H, sorted_rows, h, rows, kb * block); i < rows; ++i) {
    const int64_t row = sorted_rows[base + i];
    if (H.key_pos[base + row] >= (kb + 1) * block) break;
    s += w[row];
    x = fmaxf(x, w[row]);
  }
  sums[hr * n_blocks + kb] = s;
  maxes[hr * n_blocks + kb] = x;
}

}  // namespace

int pool_by_position(const float* probs, int64_t R, const PagedHeads& heads,
                     const int64_t* sorted_rows, int64_t block, int64_t n_blocks, float* sum,
                     float* max, void* stream) {
  if (block < 1 || R < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (heads.n_heads == 0 || n_blocks == 0) return 0;
  const dim3 grid(blocks_for(n_blocks, 128), static_cast<unsigned>(heads.n_heads * R));
  pool_kernel<<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(probs, R, heads, sorted_rows,
                                                                   block, n_blocks, sum, max);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvscope::kernels::cuda
