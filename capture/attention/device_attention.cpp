#include "capture/attention/device_attention.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "capture/attention/blocked_attention.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda/kernels_cuda.h"
#endif

namespace kvscope::cache {

DevicePrefill parse_device_prefill(const std::string& text) {
  if (text == "kernel") return DevicePrefill::Kernel;
  if (text == "blocked") return DevicePrefill::Blocked;
  throw InputError("", "--device-prefill", "\"" + text + "\" (expected kernel or blocked)");
}

#ifdef KVSCOPE_HAVE_CUDA

bool device_attention_compiled() {
  return true;
}

namespace {

namespace kc = kernels::cuda;

// Our kernels run on the legacy default stream of the CUDA runtime they were
// linked with, LibTorch's copies on its own current stream: a device
// synchronisation after each launch keeps the two in order.
void check(int rc, const char* kernel) {
  if (rc != 0)
    throw std::runtime_error(std::string("CUDA kernel ") + kernel + " failed (cudaError_t " +
                             std::to_string(rc) + ")");
  torch::cuda::synchronize();
}

// The first `count` floats of t (all when negative) on the host: the
// kernels' buffers hold at least one float, for empty layers too.
std::vector<float> to_host(const torch::Tensor& t, int64_t count = -1) {
  const torch::Tensor h = t.to(torch::kCPU).contiguous();
  const int64_t n = count < 0 ? h.numel() : count;
  return std::vector<float>(h.data_ptr<float>(), h.data_ptr<float>() + n);
}

// The layer's page tables on the device. The tensors own the memory the
// PagedHeads pointers point into.
struct DeviceTables {
  torch::Tensor meta;   // int64: row_begin [K + 1], page_begin [K + 1], key_pos [rows]
  torch::Tensor pages;  // int64 addresses: key rows of each page, then value rows
  kc::PagedHeads heads;
};

DeviceTables build_tables(RaggedKvCache& cache, int64_t layer, int tier, torch::Device device,
                          DeviceLayerAttention* result) {
  const int64_t K = cache.n_kv_heads();
  KvPool& pool = cache.pool(tier);
  std::vector<int64_t> page_begin{0}, k_addr, v_addr;
  result->row_begin.assign(1, 0);
  result->key_pos.clear();
  int64_t max_rows = 0;
  for (int64_t h = 0; h < K; ++h) {
    const std::vector<int32_t>& pos = cache.positions(layer, h, tier);
    result->key_pos.insert(result->key_pos.end(), pos.begin(), pos.end());
    result->row_begin.push_back(int64_t(result->key_pos.size()));
    max_rows = std::max<int64_t>(max_rows, int64_t(pos.size()));
    for (int32_t page : cache.pages(layer, h, tier)) {
      k_addr.push_back(reinterpret_cast<int64_t>(pool.mirror_rows(page, 0)));
      v_addr.push_back(reinterpret_cast<int64_t>(pool.mirror_rows(page, 1)));
    }
    page_begin.push_back(int64_t(k_addr.size()));
  }
  std::vector<int64_t> meta(result->row_begin);
  meta.insert(meta.end(), page_begin.begin(), page_begin.end());
  meta.insert(meta.end(), result->key_pos.begin(), result->key_pos.end());
  std::vector<int64_t> addr(k_addr);
  addr.insert(addr.end(), v_addr.begin(), v_addr.end());
  if (addr.empty()) addr.push_back(0);  // no page anywhere: the kernels read none

  DeviceTables t;
  t.meta = torch::tensor(meta, torch::kInt64).to(device);
  t.pages = torch::tensor(addr, torch::kInt64).to(device);
  const int64_t* m = t.meta.data_ptr<int64_t>();
  const int64_t* a = t.pages.data_ptr<int64_t>();
  t.heads.n_heads = K;
  t.heads.head_dim = cache.head_dim();
  t.heads.page_rows = cache.page_rows();
  t.heads.max_rows = max_rows;
  t.heads.row_begin = m;
  t.heads.page_begin = m + K + 1;
  t.heads.key_pos = m + 2 * (K + 1);
  // The pages' addresses, as the pointer type of the pool's rows.
  if (pool.format() == RowFormat::BF16 || pool.format() == RowFormat::F16) {
    t.heads.k_half = reinterpret_cast<const uint16_t* const*>(a);
    t.heads.v_half = reinterpret_cast<const uint16_t* const*>(a + k_addr.size());
    t.heads.half_kind = pool.format() == RowFormat::BF16 ? kc::kHalfBF16 : kc::kHalfF16;
  } else {
    KVSCOPE_CHECK(pool.format() == RowFormat::F32,
                  "build_tables: the kernels read float32, bfloat16 or float16 pages");
    t.heads.k_pages = reinterpret_cast<const float* const*>(a);
    t.heads.v_pages = reinterpret_cast<const float* const*>(a + k_addr.size());
  }
  return t;
}

// Received weights per row of queries [a, b) of a prefill chunk qd [K, R, n, hd].
std::vector<float> prefill_mass(const torch::Tensor& qd, const torch::Tensor& lse, int64_t a,
                                int64_t b, int64_t pos0, const kc::PagedHeads& heads, float scale,
                                int64_t window, int64_t rows) {
  const int64_t n = qd.size(2);
  const torch::Tensor q = (a == 0 && b == n) ? qd : qd.narrow(2, a, b - a).contiguous();
  const torch::Tensor l = (a == 0 && b == n) ? lse : lse.narrow(2, a, b - a).contiguous();
  torch::Tensor mass = torch::zeros({std::max<int64_t>(rows, 1)}, qd.options());
  check(kc::prefill_received(q.data_ptr<float>(), qd.size(1), b - a, pos0 + a, heads, scale, window,
                             l.data_ptr<float>(), mass.data_ptr<float>(), nullptr),
        "prefill_received");
  return to_host(mass, rows);
}

// Each head's rows (0-based within the head) in ascending position order:
// the pooled passes add a key block's rows in that order.
torch::Tensor sorted_rows(const DeviceLayerAttention& r, torch::Device device) {
  std::vector<int64_t> order(r.key_pos.size());
  for (size_t h = 0; h + 1 < r.row_begin.size(); ++h) {
    const int64_t b = r.row_begin[h], e = r.row_begin[h + 1];
    std::iota(order.begin() + b, order.begin() + e, int64_t(0));
    std::sort(order.begin() + b, order.begin() + e, [&](int64_t x, int64_t y) {
      return r.key_pos[size_t(b + x)] < r.key_pos[size_t(b + y)];
    });
  }
  if (order.empty()) order.push_back(0);
  return torch::tensor(order, torch::kInt64).to(device);
}

// Runs a pooled pass into sum / max [heads, q_blocks, n_blocks] on the
// device (`pass(sum, max)`) and keeps both in `result`.
template <class Pass>
void take_pooled(DeviceLayerAttention* result, int64_t heads, int64_t q_blocks, int64_t n_blocks,
                 const torch::TensorOptions& f32, const Pass& pass) {
  torch::Tensor sum = torch::empty({heads * q_blocks * n_blocks}, f32);
  torch::Tensor max = torch::empty({heads * q_blocks * n_blocks}, f32);
  pass(sum.data_ptr<float>(), max.data_ptr<float>());
  result->q_blocks = q_blocks;
  result->n_blocks = n_blocks;
  result->pooled_sum = to_host(sum);
  result->pooled_max = to_host(max);
}

// The decode kernel for one query per query head, qd [K, R, hd] at q_pos:
// out [K, R, hd], probs (DecodeOutputs::probs) and, when asked, the mass.
struct DecodeRun {
  torch::Tensor out, probs, mass;
};

DecodeRun run_decode(const torch::Tensor& q, const DeviceTables& t, int64_t rows, int64_t q_pos,
                     float scale, int64_t window, bool mass) {
  const int64_t K = q.size(0), R = q.size(1), hd = q.size(2);
  const torch::Tensor qd = q.to(torch::kFloat32).contiguous();
  const torch::TensorOptions f32 = qd.options();
  DecodeRun d;
  d.out = torch::empty({K, R, hd}, f32);
  d.probs = torch::empty({std::max<int64_t>(R * rows, 1)}, f32);
  if (mass) d.mass = torch::zeros({std::max<int64_t>(rows, 1)}, f32);
  torch::Tensor scratch =
      torch::empty({int64_t(kc::decode_scratch_floats(K, R, hd, t.heads.max_rows)) + 1}, f32);
  const kc::DecodeOutputs o{d.out.data_ptr<float>(), d.probs.data_ptr<float>(),
                            mass ? d.mass.data_ptr<float>() : nullptr, scratch.data_ptr<float>()};
  check(kc::decode_attention(qd.data_ptr<float>(), R, t.heads, q_pos, scale, window, o, nullptr),
        "decode_attention");
  return d;
}

}  // namespace

DeviceLayerAttention attend_layer_on_device(RaggedKvCache& cache, int64_t layer, int tier,
                                            const torch::Tensor& q, int64_t pos0, double scale,
                                            int64_t window, const DeviceStatsWanted& wanted,
                                            DevicePrefill prefill) {
  const int64_t n = q.size(0), H = cache.n_heads(), K = cache.n_kv_heads(), R = H / K,
                hd = cache.head_dim();
  KVSCOPE_CHECK(R <= kc::kMaxGroup && hd <= kc::kMaxHeadDim && hd % 2 == 0,
                "attend_layer_on_device: head shape beyond the CUDA kernels");
  cache.pool(tier).sync_mirror();
  if (n > 1 && prefill == DevicePrefill::Blocked) {
    torch::cuda::synchronize();  // the mirror's upload is in place
    return attend_layer_blocked(cache, layer, {tier}, {cache.pool(tier).mirror_pages()}, q, pos0,
                                scale, window, wanted);
  }
  DeviceLayerAttention result;
  DeviceTables t = build_tables(cache, layer, tier, q.device(), &result);
  const int64_t rows = result.row_begin.back();
  const float s = float(scale);
  const torch::TensorOptions f32 = torch::TensorOptions(torch::kFloat32).device(q.device());
  torch::cuda::synchronize();  // the mirror's upload and the tables are in place
  if (n == 1) {
    const DecodeRun d =
        run_decode(q.reshape({K, R, hd}), t, rows, pos0, s, window,
                   wanted.received || wanted.last_query || wanted.window_end > wanted.window_begin);
    result.out = d.out.reshape({1, H, hd});
    if (wanted.pooled_block > 0) {
      const int64_t B = wanted.pooled_block, nb = (pos0 + n + B - 1) / B;
      const torch::Tensor order = sorted_rows(result, q.device());
      take_pooled(&result, K * R, 1, nb, f32, [&](float* sum, float* max) {
        check(kc::pool_by_position(d.probs.data_ptr<float>(), R, t.heads, order.data_ptr<int64_t>(),
                                   B, nb, sum, max, nullptr),
              "pool_by_position");
      });
    }
    if (d.mass.defined()) {
      const std::vector<float> m = to_host(d.mass, rows);
      if (wanted.received) result.received = m;
      if (wanted.last_query) result.last_query = m;
      if (wanted.window_end > wanted.window_begin) result.window = m;
    }
    if (wanted.last_query_by_head) result.last_query_by_head = to_host(d.probs, R * rows);
  } else {
    const torch::Tensor qd =
        q.reshape({n, K, R, hd}).permute({1, 2, 0, 3}).to(torch::kFloat32).contiguous();
    torch::Tensor out = torch::empty({K, R, n, hd}, f32);
    torch::Tensor lse = torch::empty({K, R, n}, f32);
    check(kc::prefill_attention(qd.data_ptr<float>(), R, n, pos0, t.heads, s, window,
                                out.data_ptr<float>(), lse.data_ptr<float>(), nullptr),
          "prefill_attention");
    result.out = out.permute({2, 0, 1, 3}).reshape({n, H, hd});
    if (wanted.received)
      result.received = prefill_mass(qd, lse, 0, n, pos0, t.heads, s, window, rows);
    if (wanted.last_query)
      result.last_query = prefill_mass(qd, lse, n - 1, n, pos0, t.heads, s, window, rows);
    if (wanted.window_end > wanted.window_begin)
      result.window = prefill_mass(qd, lse, wanted.window_begin, wanted.window_end, pos0, t.heads,
                                   s, window, rows);
    if (wanted.last_query_by_head) {  // the last query alone, through the decode kernel
      const DecodeRun d = run_decode(qd.select(2, n - 1), t, rows, pos0 + n - 1, s, window, false);
      result.last_query_by_head = to_host(d.probs, R * rows);
    }
    if (wanted.pooled_block > 0) {
      const int64_t B = wanted.pooled_block, nb = (pos0 + n + B - 1) / B,
                    qb = kc::prefill_query_blocks(n, pos0, B);
      const torch::Tensor order = sorted_rows(result, q.device());
      take_pooled(&result, K * R, qb, nb, f32, [&](float* sum, float* max) {
        check(
            kc::prefill_pooled(qd.data_ptr<float>(), R, n, pos0, t.heads, order.data_ptr<int64_t>(),
                               s, window, lse.data_ptr<float>(), B, nb, sum, max, nullptr),
            "prefill_pooled");
      });
    }
  }
  result.out = result.out.contiguous();
  return result;
}

#else

bool device_attention_compiled() {
  return false;
}

DeviceLayerAttention attend_layer_on_device(RaggedKvCache&, int64_t, int, const torch::Tensor&,
                                            int64_t, double, int64_t, const DeviceStatsWanted&,
                                            DevicePrefill) {
  KVSCOPE_CHECK(false,
                "attend_layer_on_device: this build has no CUDA kernels (nvcc was not found)");
  std::abort();  // unreachable: the check throws
}

#endif

}  // namespace kvscope::cache
