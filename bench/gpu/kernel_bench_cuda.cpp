// The CUDA attention kernels on a Llama-3.1-8B-shaped layer (32 query heads,
// 8 kv heads, head_dim 128; shapes from the published config, random values)
// at 8K and 32K tokens in the ragged paged cache (16-row pages, every row
// held): decode with no statistics, with the received mass, and with received
// + pooled (16-token blocks); float and INT4 pages; prefill forward with and
// without its statistics passes. Prints one JSON object per measurement
// (CUDA-event time per call, mean over the repetitions after a warm-up).
// bench/gpu/sdpa_anchor.py times PyTorch's SDPA on the same shapes in the
// same run (bench/gpu/run-kernels.sh).
// usage: bench_kernels_cuda [contexts...]   (default 8192 32768)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant_int4.h"

namespace {

using namespace kvscope::kernels;

constexpr int64_t kKvHeads = 8, kGroup = 4, kHeadDim = 128, kLayers = 32, kPageRows = 16,
                  kBlock = 16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_kernels_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(int e, const char* what) {
  check(static_cast<cudaError_t>(e), what);
}

template <typename T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = device_alloc<T>(h.size());
  check(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

// A random layer of ctx rows per kv head, in pages carved from one slab per
// side (float, or INT4 codes + params).
struct Layer {
  cuda::PagedHeads heads;
  int64_t* sorted_rows = nullptr;
  size_t kv_bytes = 0;
};

Layer make_layer(int64_t ctx, bool int4, std::mt19937& rng) {
  const int64_t pages_per_head = (ctx + kPageRows - 1) / kPageRows,
                pages = kKvHeads * pages_per_head;
  std::vector<int64_t> row_begin, page_begin, pos, sorted;
  for (int64_t h = 0; h <= kKvHeads; ++h) {
    row_begin.push_back(h * ctx);
    page_begin.push_back(h * pages_per_head);
  }
  for (int64_t h = 0; h < kKvHeads; ++h)
    for (int64_t i = 0; i < ctx; ++i) {
      pos.push_back(i);
      sorted.push_back(i);
    }
  Layer L;
  cuda::PagedHeads& H = L.heads;
  H.n_heads = kKvHeads;
  H.head_dim = kHeadDim;
  H.page_rows = kPageRows;
  H.max_rows = ctx;
  H.row_begin = device_copy(row_begin);
  H.page_begin = device_copy(page_begin);
  H.key_pos = device_copy(pos);
  L.sorted_rows = device_copy(sorted);
  const int64_t page_floats = kPageRows * kHeadDim;
  std::normal_distribution<float> normal;
  std::vector<float> host(size_t(pages * page_floats));
  for (int side = 0; side < 2; ++side) {
    for (float& x : host) x = normal(rng);
    float* slab = device_copy(host);
    if (!int4) {
      std::vector<const float*> ptr;
      for (int64_t p = 0; p < pages; ++p) ptr.push_back(slab + p * page_floats);
      (side == 0 ? H.k_pages : H.v_pages) = device_copy(ptr);
      L.kv_bytes += host.size() * sizeof(float);
      continue;
    }
    const int64_t rows = pages * kPageRows, code_bytes = int4_code_bytes(kHeadDim),
                  params = int4_groups(kHeadDim) * 2;
    uint8_t* codes = device_alloc<uint8_t>(size_t(rows * code_bytes));
    float* par = device_alloc<float>(size_t(rows * params));
    check(cuda::quantize_int4(slab, rows, kHeadDim, codes, par, nullptr), "quantize_int4");
    check(cudaFree(slab), "cudaFree");
    std::vector<const uint8_t*> cp;
    std::vector<const float*> pp;
    for (int64_t p = 0; p < pages; ++p) {
      cp.push_back(codes + p * kPageRows * code_bytes);
      pp.push_back(par + p * kPageRows * params);
    }
    (side == 0 ? H.k_codes : H.v_codes) = device_copy(cp);
    (side == 0 ? H.k_params : H.v_params) = device_copy(pp);
    L.kv_bytes += size_t(rows * (code_bytes + params * 4));
  }
  return L;
}

// Mean milliseconds per call of f over `reps` calls after `warm` calls.
double time_ms(const std::function<void()>& f, int warm, int reps) {
  for (int i = 0; i < warm; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  check(cudaEventSynchronize(b), "benchmark");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

void report(const char* phase, const char* pages, const char* stats, int64_t ctx, double ms,
            size_t kv_bytes) {
  std::printf(
      "{\"phase\": \"%s\", \"pages\": \"%s\", \"stats\": \"%s\", \"context\": %lld, "
      "\"ms_per_layer\": %.4f, \"ms_for_%lld_layers\": %.3f, \"kv_bytes_per_layer\": %zu}\n",
      phase, pages, stats, (long long)ctx, ms, (long long)kLayers, ms * kLayers, kv_bytes);
  std::fflush(stdout);
}

void decode(int64_t ctx, bool int4, std::mt19937& rng) {
  Layer L = make_layer(ctx, int4, rng);
  const int64_t K = kKvHeads, R = kGroup, hd = kHeadDim, n_blocks = ctx / kBlock + 1;
  std::vector<float> q(size_t(K * R * hd));
  std::normal_distribution<float> normal;
  for (float& x : q) x = normal(rng);
  float* dq = device_copy(q);
  cuda::DecodeOutputs o;
  o.out = device_alloc<float>(q.size());
  o.probs = device_alloc<float>(size_t(R * K * ctx));
  o.scratch = device_alloc<float>(cuda::decode_scratch_floats(K, R, hd, ctx));
  float* received = device_alloc<float>(size_t(K * ctx));
  float* psum = device_alloc<float>(size_t(K * R * n_blocks));
  float* pmax = device_alloc<float>(size_t(K * R * n_blocks));
  const float scale = 1.0f / std::sqrt(float(hd));
  const char* pages = int4 ? "int4" : "f32";
  for (int stats = 0; stats < 3; ++stats) {
    cuda::DecodeOutputs os = o;
    os.received = stats >= 1 ? received : nullptr;
    const double ms = time_ms(
        [&] {
          check(cuda::decode_attention(dq, R, L.heads, ctx, scale, 0, os, nullptr), "decode");
          if (stats == 2)
            check(cuda::pool_by_position(os.probs, R, L.heads, L.sorted_rows, kBlock, n_blocks,
                                         psum, pmax, nullptr),
                  "pool");
        },
        10, 100);
    report("decode", pages,
           stats == 0   ? "none"
           : stats == 1 ? "received"
                        : "received+pooled",
           ctx, ms, L.kv_bytes);
  }
}

void prefill(int64_t ctx, std::mt19937& rng, bool with_stats) {
  Layer L = make_layer(ctx, false, rng);
  const int64_t K = kKvHeads, R = kGroup, hd = kHeadDim, n = ctx, n_blocks = ctx / kBlock + 1;
  const int64_t q_blocks = cuda::prefill_query_blocks(n, 0, kBlock);
  std::vector<float> q(size_t(K * R * n * hd));
  std::normal_distribution<float> normal;
  for (float& x : q) x = normal(rng);
  float* dq = device_copy(q);
  float* out = device_alloc<float>(q.size());
  float* lse = device_alloc<float>(size_t(K * R * n));
  const float scale = 1.0f / std::sqrt(float(hd));
  const int reps = ctx > 8192 ? 1 : 3;
  double ms = time_ms(
      [&] {
        check(cuda::prefill_attention(dq, R, n, 0, L.heads, scale, 0, out, lse, nullptr),
              "prefill");
      },
      1, reps);
  report("prefill", "f32", "none", ctx, ms, L.kv_bytes);
  if (!with_stats) return;
  float* received = device_alloc<float>(size_t(K * ctx));
  ms = time_ms(
      [&] {
        check(cuda::prefill_received(dq, R, n, 0, L.heads, scale, 0, lse, received, nullptr),
              "prefill_received");
      },
      1, reps);
  report("prefill", "f32", "received pass alone", ctx, ms, L.kv_bytes);
  float* psum = device_alloc<float>(size_t(K * R * q_blocks * n_blocks));
  float* pmax = device_alloc<float>(size_t(K * R * q_blocks * n_blocks));
  ms = time_ms(
      [&] {
        check(cuda::prefill_pooled(dq, R, n, 0, L.heads, L.sorted_rows, scale, 0, lse, kBlock,
                                   n_blocks, psum, pmax, nullptr),
              "prefill_pooled");
      },
      1, reps);
  report("prefill", "f32", "pooled pass alone", ctx, ms, L.kv_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_kernels_cuda: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("{\"device\": \"%s\", \"sm\": \"%d%d\", \"kernels\": \"%s\"}\n", prop.name,
              prop.major, prop.minor, cuda::build_info());
  std::vector<int64_t> contexts;
  for (int i = 1; i < argc; ++i) contexts.push_back(std::atoll(argv[i]));
  if (contexts.empty()) contexts = {8192, 32768};
  std::mt19937 rng(1);
  for (int64_t ctx : contexts) {
    decode(ctx, false, rng);
    decode(ctx, true, rng);
  }
  for (int64_t ctx : contexts) prefill(ctx, rng, ctx <= 8192);
  return 0;
}
