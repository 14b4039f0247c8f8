// Decode attention over the paged cache (kernels_cuda.h, decode_attention):
// the CUDA twin of kernels/cpu/attention_decode_cpu.cpp, split by chunks of
// kChunk rows as it is, and combined in chunk order.
//
// Pass 1 (decode_chunks, a block per (kv head, chunk)): each warp walks a
// run of the chunk's rows once, reading key and value together (lanes across the head's
// dimensions), with an online softmax per query head r: running max m,
// l = sum exp(s - m), o = sum exp(s - m) v. The warps' results are combined
// in warp order into the chunk's m_c, l_c, o_c; each row's score goes to
// probs.
// Pass 2 (combine_chunks, a block per (kv head, query head)): M = max_c m_c,
// L = sum_c l_c exp(m_c - M) (a fixed reduction tree), out = sum_c o_c
// exp(m_c - M) / L in chunk order; M and L are kept.
// Pass 3 (finish_weights): weight = exp(s - M) / L, and the weight each row
// received, summed over the group's query heads.
// Decode reads the whole cache once per step: the kernel is bound by memory
// bandwidth, so each warp loads its next row while it computes the current,
// a lane's dimensions are consecutive (one 16-byte load at head_dim 128) and
// a page's pointers are read once per run of rows.
#include <cuda_runtime.h>

#include "kernels/cuda/paged_rows.cuh"

namespace kvscope::kernels::cuda {

namespace {

using namespace detail;

constexpr int64_t kChunk = 256;  // rows per chunk, as the CPU kernel's
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// One row's slice for a lane: dimensions lane * SLOTS .. lane * SLOTS +
// SLOTS - 1 (consecutive, so a lane's floats load as one vector).
template <int SLOTS>
struct RowSlice {
  float k[SLOTS], v[SLOTS];
};

// Four consecutive INT4 values (two code bytes, low nibble first) of one
// group (params: scale, min), dequantised as int4_value does.
template <int SLOTS>
__device__ inline void int4_slice(const uint8_t* codes, const float* params, float* x) {
  const uint16_t c = *reinterpret_cast<const uint16_t*>(codes);
  const float2 p = *reinterpret_cast<const float2*>(params);
#pragma unroll
  for (int s = 0; s < 4 && s < SLOTS; ++s)
    x[s] = __fadd_rn(p.y, __fmul_rn(p.x, float((c >> (4 * s)) & 0x0F)));
}

// Reads a warp's run of consecutive rows of one head, looking each page's
// pointers up once (a page holds page_rows consecutive rows).
template <int SLOTS>
struct RowReader {
  const PagedHeads& H;
  int64_t first_page, page = -1;
  const float *k = nullptr, *v = nullptr;
  const uint16_t *kh = nullptr, *vh = nullptr;
  const uint8_t *kc = nullptr, *vc = nullptr;
  const float *kp = nullptr, *vp = nullptr;

  __device__ RowReader(const PagedHeads& heads, int64_t h)
      : H(heads), first_page(heads.page_begin[h]) {}

  __device__ void load(int64_t i, int lane, RowSlice<SLOTS>& x) {
    const int64_t p = first_page + i / H.page_rows, slot = i % H.page_rows, hd = H.head_dim;
    if (p != page) {
      page = p;
      if (H.k_codes) {
        kc = H.k_codes[p], vc = H.v_codes[p], kp = H.k_params[p], vp = H.v_params[p];
      } else if (H.k_half) {
        kh = H.k_half[p], vh = H.v_half[p];
      } else {
        k = H.k_pages[p], v = H.v_pages[p];
      }
    }
    const int64_t d0 = lane * SLOTS;
    if (H.k_half && SLOTS == 4 && hd % 4 == 0 && d0 + 4 <= hd) {  // 8-byte aligned
      const uint2 a = *reinterpret_cast<const uint2*>(kh + slot * hd + d0);
      const uint2 b = *reinterpret_cast<const uint2*>(vh + slot * hd + d0);
      const uint32_t kw[2] = {a.x, a.y}, vw[2] = {b.x, b.y};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        x.k[s] = half_bits_to_float(uint16_t(kw[s / 2] >> (16 * (s % 2))), H.half_kind);
        x.v[s] = half_bits_to_float(uint16_t(vw[s / 2] >> (16 * (s % 2))), H.half_kind);
      }
      return;
    }
    if (!H.k_codes && !H.k_half && SLOTS == 4 && hd % 4 == 0 && d0 + 4 <= hd) {  // 16-byte aligned
      const float4 a = *reinterpret_cast<const float4*>(k + slot * hd + d0);
      const float4 b = *reinterpret_cast<const float4*>(v + slot * hd + d0);
      x.k[0] = a.x, x.k[1] = a.y, x.k[2] = a.z, x.k[3] = a.w;
      x.v[0] = b.x, x.v[1] = b.y, x.v[2] = b.z, x.v[3] = b.w;
      return;
    }
    if (H.k_codes && SLOTS == 4 && hd % kInt4Group == 0 && d0 + 4 <= hd) {  // 2 code bytes, 1 group
      const int64_t groups = hd / kInt4Group, g = d0 / kInt4Group;
      int4_slice<SLOTS>(kc + slot * (hd / 2) + d0 / 2, kp + (slot * groups + g) * 2, x.k);
      int4_slice<SLOTS>(vc + slot * (hd / 2) + d0 / 2, vp + (slot * groups + g) * 2, x.v);
      return;
    }
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int64_t d = d0 + s;
      const bool in = d < hd;
      if (!in) {
        x.k[s] = x.v[s] = 0.0f;
      } else if (H.k_codes) {
        x.k[s] = int4_value(kc, kp, hd, slot, d);
        x.v[s] = int4_value(vc, vp, hd, slot, d);
      } else if (H.k_half) {
        x.k[s] = half_bits_to_float(kh[slot * hd + d], H.half_kind);
        x.v[s] = half_bits_to_float(vh[slot * hd + d], H.half_kind);
      } else {
        x.k[s] = k[slot * hd + d];
        x.v[s] = v[slot * hd + d];
      }
    }
  }
};

// A chunk's partial results in scratch: [K, chunks, R * (hd + 2)] laid out
// as m [R], l [R], o [R, hd] (the CPU kernel's layout); after them, per
// (kv head, query head), the combined M and L.
__device__ inline float* chunk_part(float* scratch, int64_t h, int64_t c, int64_t chunks, int64_t R,
                                    int64_t hd) {
  return scratch + (h * chunks + c) * R * (hd + 2);
}
__device__ inline float* head_totals(float* scratch, int64_t K, int64_t chunks, int64_t R,
                                     int64_t hd) {
  return scratch + K * chunks * R * (hd + 2);
}

// RMAX >= R query heads, SLOTS = ceil(hd / 32): both fixed at compile time so
// the running sums stay in registers.
template <int RMAX, int SLOTS>
__global__ void __launch_bounds__(kThreads)
    decode_chunks(const float* q, int64_t R, PagedHeads H, int64_t q_pos, float scale,
                  int64_t window, float* probs, float* scratch, int64_t chunks) {
  const int64_t h = blockIdx.x, c = blockIdx.y, hd = H.head_dim;
  const int64_t rows = head_rows(H, h), c0 = c * kChunk;
  if (c0 >= rows) return;
  const int64_t n = min(kChunk, rows - c0);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float qr[RMAX][SLOTS], m[RMAX], l[RMAX], o[RMAX][SLOTS];
#pragma unroll
  for (int r = 0; r < RMAX; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int64_t d = lane * SLOTS + s;
      qr[r][s] = r < R && d < hd ? q[(h * R + r) * hd + d] : 0.0f;
      o[r][s] = 0.0f;
    }
  }
  const int64_t* key_pos = H.key_pos + H.row_begin[h] + c0;
  float* head_probs = probs + R * H.row_begin[h];
  // Each warp takes a run of consecutive rows (its pages' pointers read once).
  const int64_t per_warp = (n + kWarps - 1) / kWarps;
  const int64_t j0 = warp * per_warp, j1 = min(n, j0 + per_warp);
  RowReader<SLOTS> reader(H, h);
  RowSlice<SLOTS> cur, next;
  if (j0 < j1) reader.load(c0 + j0, lane, cur);
  for (int64_t j = j0; j < j1; ++j) {
    if (j + 1 < j1) reader.load(c0 + j + 1, lane, next);  // in flight while this row computes
    const bool visible = key_visible(key_pos[j], q_pos, window);
#pragma unroll
    for (int r = 0; r < RMAX; ++r) {
      if (r >= R) break;
      float part = 0.0f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) part += qr[r][s] * cur.k[s];
      const float score = visible ? warp_sum(part) * scale : kNegInf;
      if (lane == 0) head_probs[r * rows + c0 + j] = score;
      if (!visible) continue;
      const float m_new = fmaxf(m[r], score);
      const float keep = exp_nonpositive(m[r] - m_new), p = exp_nonpositive(score - m_new);
      l[r] = l[r] * keep + p;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) o[r][s] = o[r][s] * keep + p * cur.v[s];
      m[r] = m_new;
    }
    cur = next;
  }

  // The warps' partial results, combined in warp order.
  __shared__ float wm[kWarps][RMAX], wl[kWarps][RMAX];
  extern __shared__ float wo[];  // [kWarps, R, hd]
#pragma unroll
  for (int r = 0; r < RMAX; ++r) {
    if (r >= R) break;
    if (lane == 0) wm[warp][r] = m[r], wl[warp][r] = l[r];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
      if (lane * SLOTS + s < hd) wo[(warp * R + r) * hd + lane * SLOTS + s] = o[r][s];
  }
  __syncthreads();
  float* part = chunk_part(scratch, h, c, chunks, R, hd);
  for (int64_t e = threadIdx.x; e < R * hd; e += blockDim.x) {
    const int64_t r = e / hd, d = e % hd;
    float mc = kNegInf;
    for (int w = 0; w < kWarps; ++w) mc = fmaxf(mc, wm[w][r]);
    float lc = 0.0f, oc = 0.0f;
    if (mc != kNegInf)
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp_nonpositive(wm[w][r] - mc);
        lc += wl[w][r] * f;
        oc += wo[(w * R + r) * hd + d] * f;
      }
    part[2 * R + e] = oc;
    if (d == 0) part[r] = mc, part[R + r] = lc;
  }
}

constexpr int kCombineThreads = 128;

// Deterministic block reductions (a fixed tree over the threads).
__device__ inline float block_reduce(float x, float* red, bool is_max) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int o = kCombineThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o)
      red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + o])
                                : red[threadIdx.x] + red[threadIdx.x + o];
    __syncthreads();
  }
  const float result = red[0];
  __syncthreads();
  return result;
}

// A block per (kv head, query head): M and L over the chunks, then out.
__global__ void __launch_bounds__(kCombineThreads)
    combine_chunks(int64_t R, PagedHeads H, float* out, float* scratch, int64_t chunks) {
  const int64_t h = blockIdx.x, r = blockIdx.y, hd = H.head_dim;
  const int64_t nc = (head_rows(H, h) + kChunk - 1) / kChunk, stride = R * (hd + 2);
  const float* parts = chunk_part(scratch, h, 0, chunks, R, hd);
  __shared__ float red[kCombineThreads];
  extern __shared__ float factor[];  // [chunks]: exp(m_c - M)
  float m = kNegInf;
  for (int64_t c = threadIdx.x; c < nc; c += blockDim.x) m = fmaxf(m, parts[c * stride + r]);
  const float M = block_reduce(m, red, true);
  float l = 0.0f;
  for (int64_t c = threadIdx.x; c < nc; c += blockDim.x) {
    const float mc = parts[c * stride + r];
    factor[c] = mc == kNegInf ? 0.0f : expf(mc - M);
    l += parts[c * stride + R + r] * factor[c];
  }
  const float L = block_reduce(l, red, false);  // also orders factor[] before its reads
  float* o = out + (h * R + r) * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t c = 0; c < nc; ++c) acc += factor[c] * parts[c * stride + 2 * R + r * hd + d];
    o[d] = M == kNegInf ? 0.0f : acc / L;
  }
  if (threadIdx.x == 0) {
    float* totals = head_totals(scratch, H.n_heads, chunks, R, hd) + h * R * 2;
    totals[2 * r] = M;
    totals[2 * r + 1] = L;
  }
}

__global__ void finish_weights(int64_t R, PagedHeads H, float* probs, float* received,
                               float* scratch, int64_t chunks) {
  const int64_t h = blockIdx.x, j = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  const int64_t rows = head_rows(H, h);
  if (j >= rows) return;
  const float* totals = head_totals(scratch, H.n_heads, chunks, R, H.head_dim) + h * R * 2;
  float* head_probs = probs + R * H.row_begin[h];
  float mass = 0.0f;
  for (int64_t r = 0; r < R; ++r) {
    const float s = head_probs[r * rows + j], M = totals[2 * r];
    const float p =
        s == kNegInf || M == kNegInf ? 0.0f : exp_nonpositive(s - M) / totals[2 * r + 1];
    head_probs[r * rows + j] = p;
    mass += p;
  }
  if (received) received[H.row_begin[h] + j] = mass;
}

template <int RMAX, int SLOTS>
void launch_chunks(dim3 grid, size_t shared, cudaStream_t s, const float* q, int64_t R,
                   const PagedHeads& H, int64_t q_pos, float scale, int64_t window, float* probs,
                   float* scratch, int64_t chunks) {
  cudaFuncSetAttribute(decode_chunks<RMAX, SLOTS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(shared));
  decode_chunks<RMAX, SLOTS>
      <<<grid, kThreads, shared, s>>>(q, R, H, q_pos, scale, window, probs, scratch, chunks);
}

template <int RMAX>
void launch_chunks_for(int64_t hd, dim3 grid, size_t shared, cudaStream_t s, const float* q,
                       int64_t R, const PagedHeads& H, int64_t q_pos, float scale, int64_t window,
                       float* probs, float* scratch, int64_t chunks) {
  // SLOTS = ceil(hd / 32) dimensions per lane.
  if (hd <= 32)
    launch_chunks<RMAX, 1>(grid, shared, s, q, R, H, q_pos, scale, window, probs, scratch, chunks);
  else if (hd <= 64)
    launch_chunks<RMAX, 2>(grid, shared, s, q, R, H, q_pos, scale, window, probs, scratch, chunks);
  else if (hd <= 128)
    launch_chunks<RMAX, 4>(grid, shared, s, q, R, H, q_pos, scale, window, probs, scratch, chunks);
  else
    launch_chunks<RMAX, 8>(grid, shared, s, q, R, H, q_pos, scale, window, probs, scratch, chunks);
}

}  // namespace

size_t decode_scratch_floats(int64_t n_heads, int64_t R, int64_t hd, int64_t max_rows) {
  const int64_t chunks = (max_rows + kChunk - 1) / kChunk;
  return static_cast<size_t>(n_heads * (chunks > 0 ? chunks : 1) * R * (hd + 2) + n_heads * R * 2);
}

int decode_attention(const float* q, int64_t R, const PagedHeads& heads, int64_t q_pos, float scale,
                     int64_t window, const DecodeOutputs& o, void* stream) {
  const int64_t hd = heads.head_dim;
  if (R < 1 || R > kMaxGroup || hd < 2 || hd > kMaxHeadDim)
    return static_cast<int>(cudaErrorInvalidValue);
  if (heads.n_heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t chunks = std::max<int64_t>(1, (heads.max_rows + kChunk - 1) / kChunk);
  const dim3 grid(static_cast<unsigned>(heads.n_heads), static_cast<unsigned>(chunks));
  const size_t shared = static_cast<size_t>(kWarps * R * hd) * sizeof(float);
  if (R <= 4)
    launch_chunks_for<4>(hd, grid, shared, s, q, R, heads, q_pos, scale, window, o.probs, o.scratch,
                         chunks);
  else if (R <= 8)
    launch_chunks_for<8>(hd, grid, shared, s, q, R, heads, q_pos, scale, window, o.probs, o.scratch,
                         chunks);
  else
    launch_chunks_for<16>(hd, grid, shared, s, q, R, heads, q_pos, scale, window, o.probs,
                          o.scratch, chunks);
  const dim3 heads_grid(static_cast<unsigned>(heads.n_heads), static_cast<unsigned>(R));
  const size_t factors = static_cast<size_t>(chunks) * sizeof(float);
  cudaFuncSetAttribute(combine_chunks, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(factors));
  combine_chunks<<<heads_grid, kCombineThreads, factors, s>>>(R, heads, o.out, o.scratch, chunks);
  const dim3 rows_grid(static_cast<unsigned>(heads.n_heads), blocks_for(heads.max_rows, 256));
  finish_weights<<<rows_grid, 256, 0, s>>>(R, heads, o.probs, o.received, o.scratch, chunks);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvscope::kernels::cuda
