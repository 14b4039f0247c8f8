// The device side of the ragged cache (--device cuda). The mirror of a pool
// is checked on the host (a pool mirrored to the CPU): after each sync it
// holds the rows of every entry, through appends, removals from any position
// (the last entry moves into the hole), growth and compaction, and a sync
// uploads only the pages written since the last one. Where a CUDA device is
// present, one layer's attention by the CUDA kernels over the mirror, and a
// prefill chunk by the blocked path, must equal the host kernels' (outputs
// and received mass); elsewhere that case says it was skipped.
#include <torch/cuda.h>

#include <cstring>
#include <random>
#include <utility>

#include "capture/attention/device_attention.h"
#include "capture/cache/ragged_cache.h"
#include "tests/capture/capture_test_util.h"

using namespace kvscope;

namespace {

using cache::RaggedKvCache;
using cache::RowFormat;

// Appends `n` entries to random heads at the next positions and removes
// about a third of the held ones, seeded.
void churn(RaggedKvCache& c, std::mt19937& rng, int64_t* next_pos, int64_t n) {
  std::vector<float> k(size_t(c.head_dim())), v(size_t(c.head_dim()));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i, ++*next_pos)
    for (int64_t l = 0; l < c.n_layers(); ++l)
      for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
        for (float& x : k) x = normal(rng);
        for (float& x : v) x = normal(rng);
        c.append(l, h, 0, *next_pos, k.data(), v.data());
      }
  for (int64_t l = 0; l < c.n_layers(); ++l)
    for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
      const std::vector<int32_t> held = c.positions(l, h, 0);
      for (int32_t p : held)
        if (rng() % 3 == 0) c.remove(l, h, p);
    }
}

// Every held row of every head reads the same bytes on both sides.
void require_mirror_matches(RaggedKvCache& c) {
  cache::KvPool& pool = c.pool(0);
  pool.sync_mirror();
  REQUIRE(pool.pages_to_sync() == 0);
  const int64_t P = c.page_rows(), hd = c.head_dim();
  for (int64_t l = 0; l < c.n_layers(); ++l)
    for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
      const int64_t count = c.count(l, h, 0);
      const std::vector<int32_t>& pages = c.pages(l, h, 0);
      for (int64_t r = 0; r < count; ++r)
        for (int kv = 0; kv < 2; ++kv) {
          const float* host = pool.row(pages[size_t(r / P)], kv, r % P);
          const float* twin =
              static_cast<const float*>(pool.mirror_rows(pages[size_t(r / P)], kv)) + (r % P) * hd;
          REQUIRE(std::memcmp(host, twin, size_t(hd) * 4) == 0);
        }
    }
}

}  // namespace

TEST_CASE("a mirrored pool holds every entry's rows after a sync", "[cache][mirror]") {
  const model::ModelConfig cfg = test::small_config();
  RaggedKvCache c(cfg, {8, 2048}, {{"hot", RowFormat::F32, true}});
  REQUIRE(c.device_tier() == -1);  // nothing mirrored yet
  std::mt19937 rng(11);
  int64_t pos = 0;
  churn(c, rng, &pos, 40);  // entries written before the mirror exists
  c.mirror_to(torch::kCPU);
  REQUIRE(c.device_tier() == 0);
  require_mirror_matches(c);

  // One new entry dirties the one page it lands in.
  std::vector<float> k(32, 1.0f), v(32, 2.0f);
  c.append(0, 0, 0, pos++, k.data(), v.data());
  REQUIRE(c.pool(0).pages_to_sync() == 1);
  require_mirror_matches(c);

  for (int round = 0; round < 6; ++round) {  // growth past the initial 64 pages, removals
    churn(c, rng, &pos, 60);
    require_mirror_matches(c);
  }
  const int64_t reserved = c.bytes_reserved();
  for (int64_t l = 0; l < c.n_layers(); ++l)  // most entries leave: compaction moves pages
    for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
      const std::vector<int32_t> held = c.positions(l, h, 0);
      for (size_t i = 0; i < held.size(); ++i)
        if (i % 8 != 0) c.remove(l, h, held[i]);
    }
  c.compact();
  REQUIRE(c.bytes_reserved() < reserved);
  require_mirror_matches(c);
}

TEST_CASE("the device kernels read one attended float32 tier", "[cache][mirror]") {
  const model::ModelConfig cfg = test::small_config();
  RaggedKvCache offload(cfg, {8, 64},
                        {{"hot", RowFormat::F32, true}, {"cold", RowFormat::F32, false}});
  offload.mirror_to(torch::kCPU);
  REQUIRE(offload.device_tier() == 0);  // the offloaded tier is never read
  RaggedKvCache warm(cfg, {8, 64},
                     {{"hot", RowFormat::F32, true}, {"warm", RowFormat::Int4, true}});
  warm.mirror_to(torch::kCPU);
  REQUIRE(warm.device_tier() == -1);  // INT4 pages are read on the host path
  cache::TierSpec pruned{"hot", RowFormat::F32, true, 0.5};
  RaggedKvCache think(cfg, {8, 64}, {pruned});
  think.mirror_to(torch::kCPU);
  REQUIRE(think.device_tier() == -1);  // keys with pruned channels too
}

TEST_CASE("CUDA layer attention equals the host kernels", "[cache][mirror][cuda]") {
  if (!cache::device_attention_compiled() || !torch::cuda::is_available()) {
    WARN("skipped: " << (cache::device_attention_compiled() ? "no CUDA device"
                                                            : "built without the CUDA kernels"));
    return;
  }
  model::ModelConfig cfg = test::small_config();
  RaggedKvCache c(cfg, {8, 2048}, {{"hot", RowFormat::F32, true}});
  c.mirror_to(torch::Device(torch::kCUDA));
  std::mt19937 rng(5);
  int64_t pos = 0;
  churn(c, rng, &pos, 300);
  const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, R = H / K, hd = cfg.head_dim;
  using cache::DevicePrefill;
  // The second prefill chunk through the blocked path (blocked_attention.h).
  for (const auto& [n, prefill] :
       {std::pair{int64_t(1), DevicePrefill::Kernel}, std::pair{int64_t(37), DevicePrefill::Kernel},
        std::pair{int64_t(37), DevicePrefill::Blocked}}) {
    // The step's own entries are in the cache when it attends.
    std::vector<float> k(size_t(hd), 0.5f), v(size_t(hd), -0.5f);
    const int64_t pos0 = pos;
    for (int64_t i = 0; i < n; ++i, ++pos)
      for (int64_t h = 0; h < K; ++h) c.append(1, h, 0, pos, k.data(), v.data());
    torch::manual_seed(uint64_t(n));
    const torch::Tensor q = torch::randn({n, H, hd});
    cache::DeviceStatsWanted want;
    want.received = want.last_query_by_head = true;
    const cache::DeviceLayerAttention dev = cache::attend_layer_on_device(
        c, 1, 0, q.to(torch::kCUDA), pos0, 1.0 / std::sqrt(double(hd)), 0, want, prefill);
    const torch::Tensor out = dev.out.to(torch::kCPU);
    for (int64_t h = 0; h < K; ++h) {
      std::vector<int64_t> key_pos;
      c.attended_positions(1, h, &key_pos);
      const int64_t m = int64_t(key_pos.size());
      const int64_t lq = n - 1;  // a lambda cannot capture the structured binding n (C++17)
      std::vector<float> mass(size_t(m), 0.0f), last(size_t(R * m), 0.0f);
      const kernels::BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0,
                                          int64_t k0) {
        kernels::sum_rows_add(p, R * b, mk, mass.data() + k0);
        if (i0 <= lq && lq < i0 + b)  // the last query's row of each query head
          for (int64_t r = 0; r < R; ++r)
            for (int64_t j = 0; j < mk; ++j)
              last[size_t(r * m + k0 + j)] = p[(r * b + lq - i0) * mk + j];
      };
      const torch::Tensor qh = q.narrow(1, h * R, R).permute({1, 0, 2}).contiguous();
      const torch::Tensor oh =
          c.attend_head(1, h, qh, pos0, 1.0 / std::sqrt(double(hd)), 0, nullptr, key_pos, &sink);
      REQUIRE(torch::allclose(out.narrow(1, h * R, R).permute({1, 0, 2}), oh, 1e-4, 1e-5));
      for (size_t j = 0; j < key_pos.size(); ++j)
        REQUIRE(dev.received[size_t(dev.row_begin[size_t(h)]) + j] == Approx(mass[j]).margin(1e-5));
      for (size_t j = 0; j < last.size(); ++j)
        REQUIRE(dev.last_query_by_head[size_t(R * dev.row_begin[size_t(h)]) + j] ==
                Approx(last[j]).margin(1e-6));
    }
  }
}
