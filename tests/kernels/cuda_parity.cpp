// The CUDA kernels (kernels/cuda/kernels_cuda.h) against their CPU twins on
// the same ragged, paged layers: random inputs and adversarial ones (an empty
// head, a window that hides whole chunks, queries that see no key, positions
// in slot order, INT4 pages, head widths 8, 64 and 128). The CPU side is
// attention_decode_segments over the same pages (one Segment per page);
// prefill and its statistics are checked query by query against it, the
// pooled sums against sums of the CPU weights by key block.
//
// A plain program (no test framework) so a GPU machine can build it with
// nvcc and g++ alone (bench/gpu/run-kernels.sh). Exits 77, which CTest
// reports as skipped, when this machine has no GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant_int4.h"
#include "kernels/row_convert.h"

namespace {

using namespace kvscope::kernels;

int g_failures = 0;
int g_checks = 0;

// |got - want| <= atol + rtol |want| everywhere; says the worst element.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& want, double atol = 2e-5, double rtol = 2e-4) {
  ++g_checks;
  if (got.size() != want.size()) {
    std::printf("FAIL %s: %zu values, expected %zu\n", what.c_str(), got.size(), want.size());
    ++g_failures;
    return;
  }
  double worst = 0;
  size_t at = 0;
  bool ok = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const bool bad = !(err <= atol + rtol * std::fabs(double(want[i])));
    if (bad) ok = false;
    if (err > worst) worst = err, at = i;
  }
  if (!ok) {
    std::printf("FAIL %s: worst |gpu - cpu| = %g at %zu (gpu %g, cpu %g)\n", what.c_str(), worst,
                at, double(got[at]), double(want[at]));
    ++g_failures;
  } else {
    std::printf("ok   %s (%zu values, worst %.3g)\n", what.c_str(), got.size(), worst);
  }
}

void expect(const std::string& what, bool ok) {
  ++g_checks;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

void check_cuda(int err, const char* what) {
  if (err != 0) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(static_cast<cudaError_t>(err)));
    std::exit(1);
  }
}

// Device allocations freed together.
struct DeviceArena {
  std::vector<void*> blocks;
  ~DeviceArena() {
    for (void* b : blocks) cudaFree(b);
  }
  template <typename T>
  T* copy(const std::vector<T>& host) {
    T* d = alloc<T>(host.size());
    if (!host.empty())
      check_cuda(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
    return d;
  }
  template <typename T>
  T* alloc(size_t n) {
    void* d = nullptr;
    check_cuda(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    blocks.push_back(d);
    return static_cast<T*>(d);
  }
};

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) check_cuda(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

// One layer of a ragged cache on the host: per kv head, its rows (keys,
// values, positions) in slot order.
struct HostLayer {
  int64_t hd = 0, page_rows = 16;
  bool int4 = false;
  int half_kind = 0;  // 16-bit pages (cuda::kHalfBF16 / kHalfF16); k, v hold their widening
  std::vector<std::vector<float>> k, v;  // [rows_h * hd]
  std::vector<std::vector<int64_t>> pos;
  int64_t heads() const { return int64_t(k.size()); }
  int64_t rows(int64_t h) const { return int64_t(pos[size_t(h)].size()); }
  int64_t total_rows() const {
    int64_t n = 0;
    for (int64_t h = 0; h < heads(); ++h) n += rows(h);
    return n;
  }
};

// Rows of head h at positions drawn from `positions` (shuffled: slot order).
HostLayer make_layer(std::mt19937& rng, int64_t hd,
                     const std::vector<std::vector<int64_t>>& positions, bool shuffle, bool int4) {
  HostLayer L;
  L.hd = hd;
  L.int4 = int4;
  std::normal_distribution<float> normal;
  for (const auto& p : positions) {
    std::vector<int64_t> pos = p;
    if (shuffle) std::shuffle(pos.begin(), pos.end(), rng);
    std::vector<float> k(pos.size() * size_t(hd)), v(k.size());
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    if (int4) {  // what the warm tier holds: quantised rows; the CPU reads them dequantised
      for (auto* m : {&k, &v}) {
        std::vector<uint8_t> codes(pos.size() * size_t(int4_code_bytes(hd)));
        std::vector<float> params(pos.size() * size_t(int4_groups(hd) * 2));
        quantize_int4(m->data(), int64_t(pos.size()), hd, codes.data(), params.data());
        dequantize_int4(codes.data(), params.data(), int64_t(pos.size()), hd, m->data());
      }
    }
    L.k.push_back(std::move(k));
    L.v.push_back(std::move(v));
    L.pos.push_back(std::move(pos));
  }
  return L;
}

// The layer stored as 16-bit pages (--kv-dtype): the host rows become what
// the pages widen back to, so the CPU twin reads the same floats.
HostLayer as_half(HostLayer L, int kind) {
  const RowType type = kind == cuda::kHalfBF16 ? RowType::BF16 : RowType::F16;
  L.half_kind = kind;
  for (auto* side : {&L.k, &L.v})
    for (std::vector<float>& rows : *side) round_row(type, rows.data(), int64_t(rows.size()));
  return L;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> r(static_cast<size_t>(std::max<int64_t>(0, b - a)));
  std::iota(r.begin(), r.end(), a);
  return r;
}

// The layer in device pages: float pages, or INT4 pages quantised on the
// host by the CPU kernel (the GPU must read the codes the CPU wrote).
struct DeviceLayer {
  DeviceArena arena;
  cuda::PagedHeads heads;
  int64_t* sorted_rows = nullptr;

  explicit DeviceLayer(const HostLayer& L) {
    const int64_t K = L.heads(), hd = L.hd, P = L.page_rows;
    std::vector<int64_t> row_begin{0}, page_begin{0}, key_pos, sorted;
    std::vector<const float*> kp, vp, kpar, vpar;
    std::vector<const uint8_t*> kc, vc;
    std::vector<const uint16_t*> kh, vh;
    const RowType half = L.half_kind == cuda::kHalfBF16 ? RowType::BF16 : RowType::F16;
    int64_t max_rows = 0;
    for (int64_t h = 0; h < K; ++h) {
      const int64_t rows = L.rows(h);
      max_rows = std::max(max_rows, rows);
      std::vector<int64_t> order = range(0, rows);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return L.pos[size_t(h)][size_t(a)] < L.pos[size_t(h)][size_t(b)];
      });
      sorted.insert(sorted.end(), order.begin(), order.end());
      key_pos.insert(key_pos.end(), L.pos[size_t(h)].begin(), L.pos[size_t(h)].end());
      for (int64_t p0 = 0; p0 < rows; p0 += P) {
        const int64_t n = std::min(P, rows - p0);
        // A whole page is allocated (slots past n stay unused, as in the cache).
        std::vector<float> kpage(static_cast<size_t>(P * hd)), vpage(static_cast<size_t>(P * hd));
        std::copy_n(L.k[size_t(h)].begin() + p0 * hd, n * hd, kpage.begin());
        std::copy_n(L.v[size_t(h)].begin() + p0 * hd, n * hd, vpage.begin());
        if (L.int4) {
          for (int side = 0; side < 2; ++side) {
            const std::vector<float>& page = side == 0 ? kpage : vpage;
            std::vector<uint8_t> codes(static_cast<size_t>(P * int4_code_bytes(hd)));
            std::vector<float> params(static_cast<size_t>(P * int4_groups(hd) * 2));
            quantize_int4(page.data(), P, hd, codes.data(), params.data());
            (side == 0 ? kc : vc).push_back(arena.copy(codes));
            (side == 0 ? kpar : vpar).push_back(arena.copy(params));
          }
        } else if (L.half_kind) {
          for (int side = 0; side < 2; ++side) {
            const std::vector<float>& page = side == 0 ? kpage : vpage;
            std::vector<uint16_t> bits(page.size());
            store_row(half, page.data(), int64_t(page.size()), bits.data());
            (side == 0 ? kh : vh).push_back(arena.copy(bits));
          }
        } else {
          kp.push_back(arena.copy(kpage));
          vp.push_back(arena.copy(vpage));
        }
      }
      row_begin.push_back(row_begin.back() + rows);
      page_begin.push_back(page_begin.back() + (rows + P - 1) / P);
    }
    heads.n_heads = K;
    heads.head_dim = hd;
    heads.page_rows = P;
    heads.max_rows = max_rows;
    heads.row_begin = arena.copy(row_begin);
    heads.page_begin = arena.copy(page_begin);
    heads.key_pos = arena.copy(key_pos);
    if (L.int4) {
      heads.k_codes = arena.copy(kc);
      heads.v_codes = arena.copy(vc);
      heads.k_params = arena.copy(kpar);
      heads.v_params = arena.copy(vpar);
    } else if (L.half_kind) {
      heads.k_half = arena.copy(kh);
      heads.v_half = arena.copy(vh);
      heads.half_kind = L.half_kind;
    } else {
      heads.k_pages = arena.copy(kp);
      heads.v_pages = arena.copy(vp);
    }
    sorted_rows = arena.copy(sorted);
  }
};

// CPU twin: one query per query head of kv head h (q_h [R, hd]) at q_pos over
// the head's rows cut into page-sized segments.
void cpu_decode(const HostLayer& L, int64_t h, const float* q_h, int64_t R, int64_t q_pos,
                float scale, int64_t window, float* out, float* probs) {
  std::vector<Segment> segments;
  const int64_t rows = L.rows(h);
  for (int64_t p0 = 0; p0 < rows; p0 += L.page_rows)
    segments.push_back({L.k[size_t(h)].data() + p0 * L.hd, L.v[size_t(h)].data() + p0 * L.hd,
                        std::min(L.page_rows, rows - p0), L.hd});
  attention_decode_segments(q_h, R, L.hd, segments, L.pos[size_t(h)].data(), q_pos, scale, window,
                            out, probs);
}

std::vector<float> random_vector(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Sum and max of weights w [R, rows] of head h by key block (CPU side).
void cpu_pool(const HostLayer& L, int64_t h, const std::vector<float>& w, int64_t R, int64_t block,
              int64_t n_blocks, float* sum, float* max) {
  const int64_t rows = L.rows(h);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t kb = L.pos[size_t(h)][size_t(j)] / block;
      if (kb >= n_blocks) continue;
      sum[r * n_blocks + kb] += w[size_t(r * rows + j)];
      max[r * n_blocks + kb] = std::max(max[r * n_blocks + kb], w[size_t(r * rows + j)]);
    }
}

void decode_case(const std::string& name, const HostLayer& L, int64_t R, int64_t q_pos,
                 int64_t window, std::mt19937& rng) {
  const int64_t K = L.heads(), hd = L.hd, total = L.total_rows(), block = 16;
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<float> q = random_vector(rng, size_t(K * R * hd));
  std::vector<float> out(q.size()), probs(static_cast<size_t>(R * total)),
      received(static_cast<size_t>(total));
  int64_t n_blocks = 1;
  for (const auto& p : L.pos)
    for (int64_t x : p) n_blocks = std::max(n_blocks, x / block + 1);
  std::vector<float> psum(static_cast<size_t>(K * R * n_blocks)), pmax(psum.size());
  int64_t first = 0;
  for (int64_t h = 0; h < K; ++h) {
    const int64_t rows = L.rows(h);
    std::vector<float> w(static_cast<size_t>(R * rows));
    cpu_decode(L, h, q.data() + h * R * hd, R, q_pos, scale, window, out.data() + h * R * hd,
               w.data());
    std::copy(w.begin(), w.end(), probs.begin() + R * first);
    for (int64_t j = 0; j < rows; ++j)
      for (int64_t r = 0; r < R; ++r) received[size_t(first + j)] += w[size_t(r * rows + j)];
    cpu_pool(L, h, w, R, block, n_blocks, psum.data() + h * R * n_blocks,
             pmax.data() + h * R * n_blocks);
    first += rows;
  }

  DeviceLayer D(L);
  cuda::DecodeOutputs o;
  o.out = D.arena.alloc<float>(out.size());
  o.probs = D.arena.alloc<float>(probs.size());
  o.received = D.arena.alloc<float>(received.size());
  o.scratch = D.arena.alloc<float>(cuda::decode_scratch_floats(K, R, hd, D.heads.max_rows));
  float* dq = D.arena.copy(q);
  check_cuda(cuda::decode_attention(dq, R, D.heads, q_pos, scale, window, o, nullptr), "decode");
  float* dsum = D.arena.alloc<float>(psum.size());
  float* dmax = D.arena.alloc<float>(pmax.size());
  check_cuda(cuda::pool_by_position(o.probs, R, D.heads, D.sorted_rows, block, n_blocks, dsum, dmax,
                                    nullptr),
             "pool_by_position");
  check_cuda(cudaDeviceSynchronize(), name.c_str());
  const std::vector<float> gout = to_host(o.out, out.size()),
                           gprobs = to_host(o.probs, probs.size());
  expect_close(name + ": decode output", gout, out, 1e-4, 1e-4);
  expect_close(name + ": decode weights", gprobs, probs);
  expect_close(name + ": received mass", to_host(o.received, received.size()), received);
  expect_close(name + ": pooled sums", to_host(dsum, psum.size()), psum);
  expect_close(name + ": pooled maxima", to_host(dmax, pmax.size()), pmax);

  // The same call again: the same bits (no atomics, fixed orders).
  check_cuda(cuda::decode_attention(dq, R, D.heads, q_pos, scale, window, o, nullptr), "decode");
  const std::vector<float> again = to_host(o.out, out.size()),
                           again_p = to_host(o.probs, probs.size());
  expect(name + ": a second run gives the same bits",
         std::memcmp(again.data(), gout.data(), gout.size() * 4) == 0 &&
             std::memcmp(again_p.data(), gprobs.data(), gprobs.size() * 4) == 0);
}

// Hidden queries: where a query sees no key the output is exactly zero.
void expect_zero_rows(const std::string& name, const std::vector<float>& out, int64_t rows,
                      int64_t hd, const std::vector<bool>& empty) {
  bool ok = true;
  for (int64_t i = 0; i < rows; ++i)
    if (empty[size_t(i)])
      for (int64_t d = 0; d < hd; ++d) ok = ok && out[size_t(i * hd + d)] == 0.0f;
  expect(name + ": queries that see no key get exact zeros", ok);
}

void prefill_case(const std::string& name, const HostLayer& L, int64_t R, int64_t n, int64_t q_pos0,
                  int64_t window, std::mt19937& rng) {
  const int64_t K = L.heads(), hd = L.hd, total = L.total_rows(), block = 16;
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::vector<float> q = random_vector(rng, size_t(K * R * n * hd));  // [K, R, n, hd]
  const int64_t q_blocks = cuda::prefill_query_blocks(n, q_pos0, block);
  int64_t n_blocks = (q_pos0 + n - 1) / block + 1;
  for (const auto& p : L.pos)
    for (int64_t x : p) n_blocks = std::max(n_blocks, x / block + 1);
  std::vector<float> out(q.size()), received(static_cast<size_t>(total));
  std::vector<float> psum(static_cast<size_t>(K * R * q_blocks * n_blocks)), pmax(psum.size());
  std::vector<bool> sees_nothing(size_t(K * R * n), false);
  int64_t first = 0;
  for (int64_t h = 0; h < K; ++h) {
    const int64_t rows = L.rows(h);
    std::vector<float> qi(static_cast<size_t>(R * hd)), oi(static_cast<size_t>(R * hd)),
        w(static_cast<size_t>(R * rows));
    std::vector<std::vector<float>> w_all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < R; ++r)
        std::copy_n(q.begin() + ((h * R + r) * n + i) * hd, hd, qi.begin() + r * hd);
      cpu_decode(L, h, qi.data(), R, q_pos0 + i, scale, window, oi.data(), w.data());
      for (int64_t r = 0; r < R; ++r) {
        std::copy_n(oi.begin() + r * hd, hd, out.begin() + ((h * R + r) * n + i) * hd);
        bool none = true;
        for (int64_t j = 0; j < rows; ++j)
          none = none && !key_visible(L.pos[size_t(h)][size_t(j)], q_pos0 + i, window);
        sees_nothing[size_t((h * R + r) * n + i)] = none;
      }
      w_all[size_t(i)] = w;
      const int64_t qb = (q_pos0 + i) / block - q_pos0 / block;
      for (int64_t r = 0; r < R; ++r) {
        // This query's weights, pooled into its query block.
        std::vector<float> wr(w.begin() + r * rows, w.begin() + (r + 1) * rows);
        std::vector<float> s(static_cast<size_t>(n_blocks)), mx(static_cast<size_t>(n_blocks));
        cpu_pool(L, h, wr, 1, block, n_blocks, s.data(), mx.data());
        float* S = psum.data() + ((h * R + r) * q_blocks + qb) * n_blocks;
        float* M = pmax.data() + ((h * R + r) * q_blocks + qb) * n_blocks;
        for (int64_t kb = 0; kb < n_blocks; ++kb) {
          S[kb] += s[size_t(kb)];
          M[kb] = std::max(M[kb], mx[size_t(kb)]);
        }
      }
    }
    for (int64_t r = 0; r < R; ++r)  // query head outer, query inner: the kernel's order
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < rows; ++j)
          received[size_t(first + j)] += w_all[size_t(i)][size_t(r * rows + j)];
    first += rows;
  }

  DeviceLayer D(L);
  float* dq = D.arena.copy(q);
  float* dout = D.arena.alloc<float>(out.size());
  float* dlse = D.arena.alloc<float>(size_t(K * R * n));
  float* drec = D.arena.alloc<float>(received.size());
  float* dsum = D.arena.alloc<float>(psum.size());
  float* dmax = D.arena.alloc<float>(pmax.size());
  check_cuda(cuda::prefill_attention(dq, R, n, q_pos0, D.heads, scale, window, dout, dlse, nullptr),
             "prefill_attention");
  check_cuda(cuda::prefill_received(dq, R, n, q_pos0, D.heads, scale, window, dlse, drec, nullptr),
             "prefill_received");
  check_cuda(cuda::prefill_pooled(dq, R, n, q_pos0, D.heads, D.sorted_rows, scale, window, dlse,
                                  block, n_blocks, dsum, dmax, nullptr),
             "prefill_pooled");
  check_cuda(cudaDeviceSynchronize(), name.c_str());
  const std::vector<float> gout = to_host(dout, out.size());
  expect_close(name + ": prefill output", gout, out, 1e-4, 1e-4);
  expect_zero_rows(name, gout, K * R * n, hd, sees_nothing);
  const std::vector<float> lse = to_host(dlse, size_t(K * R * n));
  bool lse_ok = true;
  for (size_t i = 0; i < lse.size(); ++i)
    lse_ok = lse_ok && (sees_nothing[i] ? lse[i] == -INFINITY : std::isfinite(lse[i]));
  expect(name + ": lse is -inf exactly where a query sees no key", lse_ok);
  expect_close(name + ": prefill received mass", to_host(drec, received.size()), received, 1e-4,
               2e-4);
  expect_close(name + ": prefill pooled sums", to_host(dsum, psum.size()), psum, 1e-4, 2e-4);
  expect_close(name + ": prefill pooled maxima", to_host(dmax, pmax.size()), pmax);
}

void int4_codes_case(std::mt19937& rng) {
  for (int64_t hd : {8, 64, 128}) {
    const int64_t rows = 300;
    std::vector<float> x = random_vector(rng, size_t(rows * hd));
    std::fill_n(x.begin(), hd, 0.5f);  // a constant row: scale 0
    std::vector<uint8_t> codes(static_cast<size_t>(rows * int4_code_bytes(hd)));
    std::vector<float> params(static_cast<size_t>(rows * int4_groups(hd) * 2)), back(x.size());
    quantize_int4(x.data(), rows, hd, codes.data(), params.data());
    dequantize_int4(codes.data(), params.data(), rows, hd, back.data());
    DeviceArena a;
    float* dx = a.copy(x);
    uint8_t* dc = a.alloc<uint8_t>(codes.size());
    float* dp = a.alloc<float>(params.size());
    float* db = a.alloc<float>(x.size());
    check_cuda(cuda::quantize_int4(dx, rows, hd, dc, dp, nullptr), "quantize_int4");
    check_cuda(cuda::dequantize_int4(dc, dp, rows, hd, db, nullptr), "dequantize_int4");
    const std::vector<uint8_t> gc = to_host(dc, codes.size());
    expect("INT4 hd " + std::to_string(hd) + ": the GPU writes the CPU's codes", gc == codes);
    expect_close("INT4 hd " + std::to_string(hd) + ": params", to_host(dp, params.size()), params,
                 0, 0);
    expect_close("INT4 hd " + std::to_string(hd) + ": dequantised rows", to_host(db, x.size()),
                 back, 0, 0);
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the CUDA kernels compiled (%s) but cannot run here\n",
                cuda::build_info());
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s (sm_%d%d); kernels %s\n", prop.name, prop.major, prop.minor,
              cuda::build_info());
  std::mt19937 rng(20261126);

  // Ragged heads: one empty, pages partly filled, positions in slot order.
  decode_case("decode hd64 ragged",
              make_layer(rng, 64, {{}, range(0, 300), range(0, 777)}, true, false), 4, 1000, 0,
              rng);
  decode_case("decode hd128 GQA",
              make_layer(rng, 128, {range(0, 2100), range(5, 1900)}, true, false), 4, 2100, 0, rng);
  // A sliding window hiding the first three chunks of 256 rows whole.
  decode_case("decode window hides whole chunks",
              make_layer(rng, 64, {range(0, 1000), range(0, 1000)}, false, false), 2, 999, 100,
              rng);
  decode_case("decode MHA hd8",
              make_layer(rng, 8, {range(0, 70), range(0, 33), range(3, 90)}, true, false), 1, 95, 0,
              rng);
  // Every key after the query: nothing visible, zeros.
  {
    HostLayer L = make_layer(rng, 64, {range(500, 800)}, true, false);
    decode_case("decode sees no key", L, 3, 100, 0, rng);
  }
  decode_case("decode INT4 hd64", make_layer(rng, 64, {range(0, 513), range(0, 40)}, true, true), 4,
              600, 0, rng);
  decode_case("decode INT4 hd128", make_layer(rng, 128, {range(0, 700), range(0, 300)}, true, true),
              4, 700, 0, rng);
  decode_case("decode INT4 hd8", make_layer(rng, 8, {range(0, 100)}, true, true), 2, 100, 32, rng);

  decode_case(
      "decode bf16 hd64",
      as_half(make_layer(rng, 64, {range(0, 513), range(0, 40)}, true, false), cuda::kHalfBF16), 4,
      600, 0, rng);
  decode_case(
      "decode fp16 hd128",
      as_half(make_layer(rng, 128, {range(0, 700), range(0, 300)}, true, false), cuda::kHalfF16), 4,
      700, 0, rng);
  decode_case("decode bf16 hd8",
              as_half(make_layer(rng, 8, {range(0, 100)}, true, false), cuda::kHalfBF16), 2, 100,
              32, rng);
  prefill_case(
      "prefill bf16 hd64",
      as_half(make_layer(rng, 64, {range(0, 340), range(100, 339)}, true, false), cuda::kHalfBF16),
      3, 40, 300, 0, rng);

  prefill_case("prefill hd64 ragged",
               make_layer(rng, 64, {range(0, 340), {}, range(100, 339)}, true, false), 3, 40, 300,
               0, rng);
  // Head 1 holds only keys after the chunk's first 20 queries: they see none.
  prefill_case("prefill queries that see nothing",
               make_layer(rng, 64, {range(0, 360), range(320, 360)}, true, false), 2, 60, 300, 0,
               rng);
  prefill_case("prefill window", make_layer(rng, 128, {range(0, 200), range(0, 200)}, true, false),
               4, 200, 0, 37, rng);
  prefill_case("prefill INT4 hd8", make_layer(rng, 8, {range(0, 90), range(10, 90)}, true, true), 2,
               90, 0, 0, rng);

  int4_codes_case(rng);
  std::printf("%d of %d checks passed\n", g_checks - g_failures, g_checks);
  return g_failures == 0 ? 0 : 1;
}
