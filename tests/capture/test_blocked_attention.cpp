// Attention by query blocks (capture/attention/blocked_attention.h), run on the
// host pages: the same tensor code a GPU runs over the mirror. Each
// head's output and every statistic (received mass, last query, observation
// window, pooled sums and maxima) must equal what the host kernel's weights
// give (RaggedKvCache::attend_head with a BlockSink), on caches churned by
// appends and removals (rows in slot order, not position order), with a
// sliding window that hides whole stretches, a head that holds nothing, and
// blocks small enough that a chunk spans many of them; and over several
// tiers, one of INT4 pages, for a prefill chunk and a decode step.
#include <torch/torch.h>

#include <cmath>
#include <random>

#include "capture/attention/blocked_attention.h"
#include "capture/cache/ragged_cache.h"
#include "kernels/attention.h"
#include "tests/capture/capture_test_util.h"

using namespace kvscope;

namespace {

using cache::RaggedKvCache;
using cache::RowFormat;

// Appends `n` entries at the next positions to every head of `layer` but
// `skip`, then removes about a third of the held ones, seeded.
void churn(RaggedKvCache& c, int64_t layer, int64_t skip, std::mt19937& rng, int64_t* next_pos,
           int64_t n) {
  std::vector<float> k(size_t(c.head_dim())), v(size_t(c.head_dim()));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i, ++*next_pos)
    for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
      if (h == skip) continue;
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      c.append(layer, h, 0, *next_pos, k.data(), v.data());
    }
  for (int64_t h = 0; h < c.n_kv_heads(); ++h) {
    const std::vector<int32_t> held = c.positions(layer, h, 0);
    for (int32_t p : held)
      if (rng() % 3 == 0) c.remove(layer, h, p);
  }
}

// The host kernel's weights of head h as one dense [R, n, m] tensor.
struct Reference {
  torch::Tensor out, weights;
  std::vector<int64_t> key_pos;
};

Reference host_reference(const RaggedKvCache& c, int64_t layer, int64_t h, const torch::Tensor& q,
                         int64_t pos0, double scale, int64_t window) {
  const int64_t n = q.size(0), R = c.n_heads() / c.n_kv_heads();
  Reference r;
  c.attended_positions(layer, h, &r.key_pos);
  const int64_t m = int64_t(r.key_pos.size());
  r.weights = torch::zeros({R, n, m});
  float* w = r.weights.data_ptr<float>();
  const kernels::BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0,
                                      int64_t k0) {
    for (int64_t rr = 0; rr < R; ++rr)
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < mk; ++j)
          w[(rr * n + i0 + i) * m + k0 + j] = p[(rr * b + i) * mk + j];
  };
  const torch::Tensor qh = q.narrow(1, h * R, R).permute({1, 0, 2}).contiguous();
  r.out = c.attend_head(layer, h, qh, pos0, scale, window, nullptr, r.key_pos, &sink);
  return r;
}

void require_close(const std::vector<float>& got, size_t at, const torch::Tensor& want) {
  const torch::Tensor w = want.contiguous();
  for (int64_t j = 0; j < w.numel(); ++j)
    REQUIRE(got[at + size_t(j)] == Approx(w.data_ptr<float>()[j]).margin(2e-5));
}

// Pooled sum / max of W [R, n, m] by (query block, key block of B positions).
std::pair<torch::Tensor, torch::Tensor> pooled_reference(const torch::Tensor& W,
                                                         const std::vector<int64_t>& key_pos,
                                                         int64_t pos0, int64_t B, int64_t qb,
                                                         int64_t nb) {
  const int64_t R = W.size(0), n = W.size(1), m = W.size(2);
  torch::Tensor sum = torch::zeros({R, qb, nb}), max = torch::zeros({R, qb, nb});
  auto s = sum.accessor<float, 3>(), x = max.accessor<float, 3>();
  auto w = W.accessor<float, 3>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const int64_t a = (pos0 + i) / B - pos0 / B, b = key_pos[size_t(j)] / B;
        s[r][a][b] += w[r][i][j];
        x[r][a][b] = std::max(x[r][a][b], w[r][i][j]);
      }
  return {sum, max};
}

}  // namespace

TEST_CASE("blocked prefill attention equals the host kernel, statistics included",
          "[cache][blocked]") {
  const model::ModelConfig cfg = test::small_config();  // 4 query heads over 2 kv heads, hd 32
  const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, R = H / K, hd = cfg.head_dim;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t window : {int64_t(0), int64_t(48)})
    for (int64_t empty_head : {int64_t(-1), int64_t(1)})
      for (int64_t budget : {int64_t(256) << 20, int64_t(3000)}) {
        INFO("window " << window << ", empty head " << empty_head << ", weight budget " << budget);
        RaggedKvCache c(cfg, {8, 1024}, {{"hot", RowFormat::F32, true}});
        std::mt19937 rng(uint32_t(7 + window + empty_head));
        int64_t pos = 0;
        churn(c, 1, empty_head, rng, &pos, 150);
        const int64_t n = 70, pos0 = pos;  // the step's own entries next
        std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
        std::normal_distribution<float> normal;
        for (int64_t i = 0; i < n; ++i, ++pos)
          for (int64_t h = 0; h < K; ++h) {
            if (h == empty_head) continue;
            for (float& x : k) x = normal(rng);
            for (float& x : v) x = normal(rng);
            c.append(1, h, 0, pos, k.data(), v.data());
          }
        torch::manual_seed(uint64_t(window + 3));
        const torch::Tensor q = torch::randn({n, H, hd});
        cache::DeviceStatsWanted want;
        want.received = want.last_query = want.last_query_by_head = true;
        want.window_begin = 50;
        want.window_end = 66;
        want.pooled_block = 16;
        const cache::DeviceLayerAttention got = cache::attend_layer_blocked(
            c, 1, {0}, {c.pool(0).host_pages()}, q, pos0, scale, window, want, budget);
        REQUIRE(got.out.sizes() == torch::IntArrayRef({n, H, hd}));
        const int64_t qb = (pos0 + n - 1) / 16 - pos0 / 16 + 1, nb = (pos0 + n + 15) / 16;
        REQUIRE(got.q_blocks == qb);
        REQUIRE(got.n_blocks == nb);
        for (int64_t h = 0; h < K; ++h) {
          const Reference ref = host_reference(c, 1, h, q, pos0, scale, window);
          const int64_t b = got.row_begin[size_t(h)], m = got.row_begin[size_t(h + 1)] - b;
          REQUIRE(m == int64_t(ref.key_pos.size()));
          for (int64_t j = 0; j < m; ++j) REQUIRE(got.key_pos[size_t(b + j)] == ref.key_pos[j]);
          const torch::Tensor out_h = got.out.narrow(1, h * R, R).permute({1, 0, 2});
          if (m == 0) {
            REQUIRE(out_h.abs().max().item<float>() == 0.0f);  // sees no key: zeros
          } else {
            REQUIRE(torch::allclose(out_h, ref.out, 1e-4, 1e-5));
          }
          require_close(got.received, size_t(b), ref.weights.sum(torch::IntArrayRef{0, 1}));
          require_close(got.last_query, size_t(b), ref.weights.select(1, n - 1).sum(0));
          // per query head: [R, m] at R * row_begin[h], the decode kernel's layout
          require_close(got.last_query_by_head, size_t(R * b), ref.weights.select(1, n - 1));
          require_close(got.window, size_t(b),
                        ref.weights.narrow(1, 50, 16).sum(torch::IntArrayRef{0, 1}));
          const auto [sum, max] = pooled_reference(ref.weights, ref.key_pos, pos0, 16, qb, nb);
          const size_t head = size_t(h * R * qb * nb);
          require_close(got.pooled_sum, head, sum);
          require_close(got.pooled_max, head, max);
        }
        if (window > 0) {  // the window hid the old rows from every query of the chunk
          const Reference ref = host_reference(c, 1, 0, q, pos0, scale, window);
          int64_t hidden = 0;
          for (size_t j = 0; j < ref.key_pos.size(); ++j)
            hidden += ref.key_pos[j] <= pos0 - window ? 1 : 0;
          REQUIRE(hidden > 0);
        }
      }
}

TEST_CASE("blocked attention reads several tiers and INT4 pages as the host kernels do",
          "[cache][blocked]") {
  // WG-KV's and KVpop's caches have several attended float32 tiers, SFC's an
  // INT4 warm tier beside its hot one, and an offloaded tier nobody reads.
  const model::ModelConfig cfg = test::small_config();
  const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, R = H / K, hd = cfg.head_dim;
  const double scale = 1.0 / std::sqrt(double(hd));
  RaggedKvCache c(cfg, {8, 1024},
                  {{"hot", RowFormat::F32, true},
                   {"warm", RowFormat::Int4, true},
                   {"cold", RowFormat::F32, false},
                   {"local", RowFormat::F32, true}});
  const std::vector<int> attended = c.whole_key_tiers();
  REQUIRE(attended == std::vector<int>{0, 1, 3});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
  int64_t pos = 0;
  auto feed = [&](int64_t n) {  // each entry into a random tier, a few removed
    for (int64_t i = 0; i < n; ++i, ++pos)
      for (int64_t h = 0; h < K; ++h) {
        for (float& x : k) x = normal(rng);
        for (float& x : v) x = normal(rng);
        c.append(1, h, int(rng() % 4), pos, k.data(), v.data());
        if (pos > 10 && rng() % 5 == 0) {
          const int64_t old = pos - 1 - int64_t(rng() % 10);
          if (c.holds(1, h, old)) c.remove(1, h, old);
        }
      }
  };
  feed(200);
  for (int64_t n : {int64_t(40), int64_t(1)}) {  // a prefill chunk, then a decode step
    INFO(n << " queries");
    const int64_t pos0 = pos;
    feed(n);
    torch::manual_seed(uint64_t(n));
    const torch::Tensor q = torch::randn({n, H, hd});
    cache::DeviceStatsWanted want;
    want.received = want.last_query_by_head = true;
    std::vector<torch::Tensor> pages;
    for (int t : attended) pages.push_back(c.pool(t).host_pages());
    const cache::DeviceLayerAttention got =
        cache::attend_layer_blocked(c, 1, attended, pages, q, pos0, scale, 0, want);
    int64_t int4_rows = 0;
    for (int64_t h = 0; h < K; ++h) {
      const Reference ref = host_reference(c, 1, h, q, pos0, scale, 0);
      const int64_t b = got.row_begin[size_t(h)], m = got.row_begin[size_t(h + 1)] - b;
      REQUIRE(m == int64_t(ref.key_pos.size()));
      for (int64_t j = 0; j < m; ++j) REQUIRE(got.key_pos[size_t(b + j)] == ref.key_pos[j]);
      REQUIRE(torch::allclose(got.out.narrow(1, h * R, R).permute({1, 0, 2}), ref.out, 1e-4, 1e-5));
      require_close(got.received, size_t(b), ref.weights.sum(torch::IntArrayRef{0, 1}));
      require_close(got.last_query_by_head, size_t(R * b), ref.weights.select(1, n - 1));
      int4_rows += c.count(1, h, 1);
    }
    REQUIRE(int4_rows > 0);  // the INT4 tier was read
  }
}

TEST_CASE("blocked attention refuses pages that are not the tiers' and pruned keys",
          "[cache][blocked]") {
  const model::ModelConfig cfg = test::small_config();
  RaggedKvCache c(cfg, {8, 64}, {{"hot", RowFormat::F32, true}});
  const torch::Tensor q = torch::randn({4, cfg.n_heads, cfg.head_dim});
  REQUIRE_THROWS_AS(cache::attend_layer_blocked(c, 0, {0}, {torch::Tensor()}, q, 0, 1.0, 0, {}),
                    std::logic_error);
  REQUIRE_THROWS_AS(cache::attend_layer_blocked(c, 0, {0}, {}, q, 0, 1.0, 0, {}), std::logic_error);
  RaggedKvCache warm(cfg, {8, 64},
                     {{"hot", RowFormat::F32, true}, {"warm", RowFormat::Int4, true}});
  // the INT4 tier's pages given for the float32 tier: another page size
  REQUIRE_THROWS_AS(
      cache::attend_layer_blocked(warm, 0, {0}, {warm.pool(1).host_pages()}, q, 0, 1.0, 0, {}),
      std::logic_error);
  cache::TierSpec pruned{"hot", RowFormat::F32, true, 0.5};
  RaggedKvCache think(cfg, {8, 64}, {pruned});
  REQUIRE(think.whole_key_tiers().empty());
  REQUIRE_THROWS_AS(
      cache::attend_layer_blocked(think, 0, {0}, {think.pool(0).host_pages()}, q, 0, 1.0, 0, {}),
      std::logic_error);
}
