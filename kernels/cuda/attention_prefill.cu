// Prefill attention over the paged cache (kernels_cuda.h): flash-style
// forward with an online softmax, and the statistics passes that recompute
// each weight from the forward's lse instead of storing the [n, rows]
// matrix (the CPU kernel streams the same weights to a BlockSink).
#include <cuda_runtime.h>

#include "kernels/cuda/paged_rows.cuh"

namespace kvscope::kernels::cuda {

namespace {

using namespace detail;

constexpr int64_t kQueries = 16;  // queries per block of the forward
constexpr int64_t kKeys = 16;     // rows per tile of the forward
constexpr int kThreads = 128;

__device__ inline float dot_shared(const float* a, const float* b, int64_t hd) {
  float s = 0.0f;
  for (int64_t d = 0; d < hd; ++d) s += a[d] * b[d];
  return s;
}

size_t forward_shared_bytes(int64_t hd) {
  const int64_t padded = hd + 1;  // rows read across threads: no bank conflicts
  return static_cast<size_t>(kQueries * padded + kKeys * padded + kKeys * hd + kQueries * kKeys +
                             3 * kQueries + kQueries * hd) *
         sizeof(float);
}

// One block: query head (h, r), queries i0 .. i0 + kQueries - 1 of the chunk.
__global__ void forward_kernel(const float* q, int64_t R, int64_t n, int64_t q_pos0, PagedHeads H,
                               float scale, int64_t window, float* out, float* lse) {
  const int64_t hr = blockIdx.x, h = hr / R, i0 = blockIdx.y * kQueries, hd = H.head_dim;
  const int64_t padded = hd + 1, rows = head_rows(H, h), base = H.row_begin[h];
  extern __shared__ float shared[];
  float* qs = shared;                  // [kQueries, hd + 1]
  float* ks = qs + kQueries * padded;  // [kKeys, hd + 1]
  float* vs = ks + kKeys * padded;     // [kKeys, hd]
  float* s = vs + kKeys * hd;          // [kQueries, kKeys]
  float* m = s + kQueries * kKeys;     // [kQueries] running max
  float* l = m + kQueries;             // [kQueries] running denominator
  float* corr = l + kQueries;          // [kQueries] this tile's rescale
  float* acc = corr + kQueries;        // [kQueries, hd]
  const int64_t nq = min(kQueries, n - i0);
  for (int64_t e = threadIdx.x; e < kQueries * hd; e += blockDim.x) {
    const int64_t i = e / hd, d = e % hd;
    qs[i * padded + d] = i < nq ? q[(hr * n + i0 + i) * hd + d] : 0.0f;
    acc[e] = 0.0f;
  }
  if (threadIdx.x < kQueries) {
    m[threadIdx.x] = kNegInf;
    l[threadIdx.x] = 0.0f;
  }
  for (int64_t t0 = 0; t0 < rows; t0 += kKeys) {
    const int64_t nk = min(kKeys, rows - t0);
    for (int64_t e = threadIdx.x; e < kKeys * hd; e += blockDim.x) {
      const int64_t j = e / hd, d = e % hd;
      const bool in = j < nk;
      const RowRef ref = row_ref(H, h, t0 + (in ? j : 0));
      ks[j * padded + d] = in ? key_at(H, ref, d) : 0.0f;
      vs[j * hd + d] = in ? value_at(H, ref, d) : 0.0f;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kQueries * kKeys; e += blockDim.x) {
      const int64_t i = e / kKeys, j = e % kKeys;
      const bool ok =
          i < nq && j < nk && key_visible(H.key_pos[base + t0 + j], q_pos0 + i0 + i, window);
      s[e] = ok ? dot_shared(qs + i * padded, ks + j * padded, hd) * scale : kNegInf;
    }
    __syncthreads();
    if (threadIdx.x < kQueries) {
      const int64_t i = threadIdx.x;
      float* si = s + i * kKeys;
      float mt = m[i];
      for (int64_t j = 0; j < kKeys; ++j) mt = fmaxf(mt, si[j]);
      if (mt == kNegInf) {
        corr[i] = 1.0f;
        for (int64_t j = 0; j < kKeys; ++j) si[j] = 0.0f;
      } else {
        corr[i] = exp_nonpositive(m[i] - mt);  // 0 while nothing was seen
        float sum = 0.0f;
        for (int64_t j = 0; j < kKeys; ++j) {
          si[j] = exp_nonpositive(si[j] - mt);
          sum += si[j];
        }
        l[i] = l[i] * corr[i] + sum;
        m[i] = mt;
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kQueries * hd; e += blockDim.x) {
      const int64_t i = e / hd, d = e % hd;
      float a = acc[e] * corr[i];
      for (int64_t j = 0; j < kKeys; ++j) a += s[i * kKeys + j] * vs[j * hd + d];
      acc[e] = a;
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < nq * hd; e += blockDim.x) {
    const int64_t i = e / hd;
    out[(hr * n + i0 + i) * hd + e % hd] = l[i] > 0.0f ? acc[e] / l[i] : 0.0f;
  }
  if (threadIdx.x < nq)
    lse[hr * n + i0 + threadIdx.x] =
        l[threadIdx.x] > 0.0f ? m[threadIdx.x] + logf(l[threadIdx.x]) : kNegInf;
}

// The weight of query i of query head (h, r) on row j: exp(score - lse).
__device__ inline float weight(const float* qi, const float* kj, int64_t hd, float scale,
                               float lse_i, bool visible) {
  if (!visible || lse_i == kNegInf) return 0.0f;
  return exp_nonpositive(dot_shared(qi, kj, hd) * scale - lse_i);
}

constexpr int64_t kRowsPerBlock = 64;  // received: a thread per row
constexpr int64_t kQueryTile = 8;

__global__ void received_kernel(const float* q, int64_t R, int64_t n, int64_t q_pos0, PagedHeads H,
                                float scale, int64_t window, const float* lse, float* received) {
  const int64_t h = blockIdx.x, j0 = blockIdx.y * kRowsPerBlock, hd = H.head_dim;
  const int64_t padded = hd + 1, rows = head_rows(H, h), base = H.row_begin[h];
  if (j0 >= rows) return;
  extern __shared__ float shared[];
  float* ks = shared;                       // [kRowsPerBlock, hd + 1]
  float* qs = ks + kRowsPerBlock * padded;  // [kQueryTile, hd]
  float* ls = qs + kQueryTile * hd;         // [kQueryTile]
  const int64_t nj = min(kRowsPerBlock, rows - j0);
  for (int64_t e = threadIdx.x; e < nj * hd; e += blockDim.x)
    ks[(e / hd) * padded + e % hd] = key_at(H, row_ref(H, h, j0 + e / hd), e % hd);
  const int64_t j = threadIdx.x;
  const int64_t pos = j < nj ? H.key_pos[base + j0 + j] : 0;
  float mass = 0.0f;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t0 = 0; t0 < n; t0 += kQueryTile) {
      const int64_t nt = min(kQueryTile, n - t0), row0 = (h * R + r) * n + t0;
      __syncthreads();
      for (int64_t e = threadIdx.x; e < nt * hd; e += blockDim.x) qs[e] = q[row0 * hd + e];
      if (threadIdx.x < nt) ls[threadIdx.x] = lse[row0 + threadIdx.x];
      __syncthreads();
      if (j < nj)
        for (int64_t i = 0; i < nt; ++i)
          mass += weight(qs + i * hd, ks + j * padded, hd, scale, ls[i],
                         key_visible(pos, q_pos0 + t0 + i, window));
    }
  if (j < nj) received[base + j0 + j] = mass;
}

constexpr int kPoolThreads = 256;

// One block per (query head, query block); it walks the key blocks, each a
// (queries x rows) rectangle reduced in a fixed tree.
__global__ void pooled_kernel(const float* q, int64_t R, int64_t n, int64_t q_pos0, PagedHeads H,
                              const int64_t* sorted_rows, float scale, int64_t window,
                              const float* lse, int64_t block, int64_t n_blocks, int64_t q_blocks,
                              float* sums, float* maxes) {
  const int64_t qb = blockIdx.x, hr = blockIdx.y, h = hr / R, hd = H.head_dim;
  const int64_t rows = head_rows(H, h), base = H.row_begin[h];
  // The chunk's queries in this query block: i_lo .. i_hi - 1.
  const int64_t first_pos = (q_pos0 / block + qb) * block;
  const int64_t i_lo = max(int64_t(0), first_pos - q_pos0),
                i_hi = min(n, first_pos + block - q_pos0);
  __shared__ float red_sum[kPoolThreads], red_max[kPoolThreads];
  float* sum_out = sums + (hr * q_blocks + qb) * n_blocks;
  float* max_out = maxes + (hr * q_blocks + qb) * n_blocks;
  const int64_t last_pos = q_pos0 + i_hi - 1;  // keys past it weigh 0 for these queries
  for (int64_t kb = 0; kb < n_blocks; ++kb) {
    if (i_hi <= i_lo || kb * block > last_pos) {  // uniform over the block
      if (threadIdx.x == 0) sum_out[kb] = max_out[kb] = 0.0f;
      continue;
    }
    const int64_t a = first_sorted_at(H, sorted_rows, h, rows, kb * block);
    const int64_t b = first_sorted_at(H, sorted_rows, h, rows, (kb + 1) * block);
    const int64_t nrows = b - a, pairs = nrows * max(int64_t(0), i_hi - i_lo);
    float s = 0.0f, x = 0.0f;
    for (int64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
      const int64_t i = i_lo + e / nrows, row = sorted_rows[base + a + e % nrows];
      const int64_t qrow = hr * n + i;
      const float* qi = q + qrow * hd;
      const RowRef ref = row_ref(H, h, row);
      float dotv = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dotv += qi[d] * key_at(H, ref, d);
      const bool vis = key_visible(H.key_pos[base + row], q_pos0 + i, window);
      const float w =
          !vis || lse[qrow] == kNegInf ? 0.0f : exp_nonpositive(dotv * scale - lse[qrow]);
      s += w;
      x = fmaxf(x, w);
    }
    red_sum[threadIdx.x] = s;
    red_max[threadIdx.x] = x;
    __syncthreads();
    for (int o = kPoolThreads / 2; o > 0; o >>= 1) {
      if (threadIdx.x < o) {
        red_sum[threadIdx.x] += red_sum[threadIdx.x + o];
        red_max[threadIdx.x] = fmaxf(red_max[threadIdx.x], red_max[threadIdx.x + o]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      sum_out[kb] = red_sum[0];
      max_out[kb] = red_max[0];
    }
    __syncthreads();
  }
}

bool shapes_ok(int64_t R, const PagedHeads& H) {
  return R >= 1 && R <= kMaxGroup && H.head_dim >= 2 && H.head_dim <= kMaxHeadDim;
}

}  // namespace

int prefill_attention(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                      float scale, int64_t window, float* out, float* lse, void* stream) {
  if (!shapes_ok(R, heads) || n < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (heads.n_heads == 0 || n == 0) return 0;
  const size_t shared = forward_shared_bytes(heads.head_dim);
  cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(shared));
  const dim3 grid(static_cast<unsigned>(heads.n_heads * R), blocks_for(n, kQueries));
  forward_kernel<<<grid, kThreads, shared, static_cast<cudaStream_t>(stream)>>>(
      q, R, n, q_pos0, heads, scale, window, out, lse);
  return static_cast<int>(cudaGetLastError());
}

int prefill_received(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                     float scale, int64_t window, const float* lse, float* received, void* stream) {
  if (!shapes_ok(R, heads) || n < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (heads.n_heads == 0 || heads.max_rows == 0) return 0;
  const int64_t hd = heads.head_dim;
  const size_t shared =
      static_cast<size_t>(kRowsPerBlock * (hd + 1) + kQueryTile * hd + kQueryTile) * sizeof(float);
  cudaFuncSetAttribute(received_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(shared));
  const dim3 grid(static_cast<unsigned>(heads.n_heads), blocks_for(heads.max_rows, kRowsPerBlock));
  received_kernel<<<grid, static_cast<unsigned>(kRowsPerBlock), shared,
                    static_cast<cudaStream_t>(stream)>>>(q, R, n, q_pos0, heads, scale, window, lse,
                                                         received);
  return static_cast<int>(cudaGetLastError());
}

int64_t prefill_query_blocks(int64_t n, int64_t q_pos0, int64_t block) {
  return n <= 0 ? 0 : (q_pos0 + n - 1) / block - q_pos0 / block + 1;
}

int prefill_pooled(const float* q, int64_t R, int64_t n, int64_t q_pos0, const PagedHeads& heads,
                   const int64_t* sorted_rows, float scale, int64_t window, const float* lse,
                   int64_t block, int64_t n_blocks, float* sum, float* max, void* stream) {
  if (!shapes_ok(R, heads) || n < 0 || block < 1) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t q_blocks = prefill_query_blocks(n, q_pos0, block);
  if (heads.n_heads == 0 || q_blocks == 0 || n_blocks == 0) return 0;
  const dim3 grid(static_cast<unsigned>(q_blocks), static_cast<unsigned>(heads.n_heads * R));
  pooled_kernel<<<grid, kPoolThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, R, n, q_pos0, heads, sorted_rows, scale, window, lse, block, n_blocks, q_blocks, sum, max);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvscope::kernels::cuda
