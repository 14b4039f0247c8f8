// Prefill attention by query blocks and matrix products (blocked_attention.h).
#include "capture/attention/blocked_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/common/check.h"
#include "kernels/quant_int4.h"
#include "kernels/row_convert.h"

namespace kvscope::cache {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One kv head's attended rows, gathered from its pages: each tier's rows in
// slot order, the tiers in order (the host path's order).
struct HeadRows {
  torch::Tensor keys, values;  // [m, hd] float32
  torch::Tensor pos;           // [m] int64
};

// Every kv head's positions and page ids in `tiers` of `layer`, each list
// uploaded to the pages' device in one copy (not one per head or tier: on a
// GPU each small copy is a round trip), and where each (head, tier) part
// begins: index h * T + t of pos_begin / page_begin, T tiers.
struct LayerRows {
  std::vector<int64_t> host_pos;               // all heads' positions in order
  torch::Tensor pos, page_ids;                 // int64 on the device, all heads in order
  std::vector<int64_t> pos_begin, page_begin;  // [K * T + 1]
};

LayerRows layer_rows(const RaggedKvCache& cache, int64_t layer, const std::vector<int>& tiers,
                     torch::Device device) {
  LayerRows r;
  std::vector<int64_t> ids;
  r.pos_begin.push_back(0);
  r.page_begin.push_back(0);
  for (int64_t h = 0; h < cache.n_kv_heads(); ++h)
    for (int tier : tiers) {
      const std::vector<int32_t>& p = cache.positions(layer, h, tier);
      const std::vector<int32_t>& g = cache.pages(layer, h, tier);
      r.host_pos.insert(r.host_pos.end(), p.begin(), p.end());
      ids.insert(ids.end(), g.begin(), g.end());
      r.pos_begin.push_back(int64_t(r.host_pos.size()));
      r.page_begin.push_back(int64_t(ids.size()));
    }
  r.pos = torch::tensor(r.host_pos, torch::kInt64).to(device);
  r.page_ids = torch::tensor(ids, torch::kInt64).to(device);
  return r;
}

// INT4 rows (kernels/quant_int4.h: hd / 2 bytes of codes, low nibble first,
// then (scale, min) per group) as float32 [n, hd]: min + scale * code, the
// CPU's dequantisation.
torch::Tensor dequantize_int4_rows(const torch::Tensor& bytes, int64_t hd) {
  const int64_t n = bytes.size(0), cb = kernels::int4_code_bytes(hd),
                groups = kernels::int4_groups(hd), gs = kernels::int4_group_size(hd);
  const torch::Tensor codes = bytes.narrow(1, 0, cb).to(torch::kInt32);
  const torch::Tensor values =
      torch::stack({codes.remainder(16), codes.div(16, "floor")}, -1).to(torch::kFloat32);
  const torch::Tensor params =
      bytes.narrow(1, cb, groups * 8).contiguous().view(torch::kFloat32).view({n, groups, 2});
  const torch::Tensor scale = params.select(2, 0).unsqueeze(2),
                      lo = params.select(2, 1).unsqueeze(2);
  return (lo + scale * values.view({n, groups, gs})).view({n, hd});
}

// Keys and values of a tier's pages [np, page_bytes] (rows key rows, then
// rows value rows), the first m rows of each.
std::pair<torch::Tensor, torch::Tensor> page_rows(const torch::Tensor& held, const KvPool& pool,
                                                  int64_t m) {
  const int64_t np = held.size(0), rows = pool.page_rows(), hd = pool.head_dim();
  if (is_float_format(pool.format())) {
    // 16-bit rows widen to float32 (exactly): the products accumulate in float32.
    const torch::ScalarType stored = kernels::scalar_type_of(cache::row_type(pool.format()));
    const torch::Tensor f = held.view(stored).view({np, 2, rows, hd});
    return {f.select(1, 0).reshape({-1, hd}).narrow(0, 0, m).to(torch::kFloat32),
            f.select(1, 1).reshape({-1, hd}).narrow(0, 0, m).to(torch::kFloat32)};
  }
  const torch::Tensor b = held.view({np, 2, rows, -1});
  const int64_t row_bytes = b.size(3);
  return {dequantize_int4_rows(b.select(1, 0).reshape({-1, row_bytes}).narrow(0, 0, m), hd),
          dequantize_int4_rows(b.select(1, 1).reshape({-1, row_bytes}).narrow(0, 0, m), hd)};
}

HeadRows gather_rows(const RaggedKvCache& cache, const LayerRows& layer, int64_t h,
                     const std::vector<int>& tiers, const std::vector<torch::Tensor>& pages) {
  const int64_t T = int64_t(tiers.size()), hd = cache.head_dim();
  const int64_t first = layer.pos_begin[size_t(h * T)];
  HeadRows r;
  r.pos = layer.pos.narrow(0, first, layer.pos_begin[size_t((h + 1) * T)] - first);
  std::vector<torch::Tensor> keys, values;
  for (int64_t t = 0; t < T; ++t) {
    const size_t i = size_t(h * T + t);
    const int64_t m = layer.pos_begin[i + 1] - layer.pos_begin[i];
    const int64_t g0 = layer.page_begin[i], np = layer.page_begin[i + 1] - g0;
    if (m == 0) continue;
    const torch::Tensor held = pages[size_t(t)].index_select(0, layer.page_ids.narrow(0, g0, np));
    auto [k, v] = page_rows(held, cache.pool(tiers[size_t(t)]), m);
    keys.push_back(k);
    values.push_back(v);
  }
  const auto f32 = pages.front().options().dtype(torch::kFloat32);
  auto join = [&](const std::vector<torch::Tensor>& parts) {
    if (parts.empty()) return torch::empty({0, hd}, f32);
    return parts.size() == 1 ? parts.front() : torch::cat(parts);  // one tier: no copy
  };
  r.keys = join(keys);
  r.values = join(values);
  return r;
}

// Softmax over the visible keys of each row of s [R, b, m] (hidden entries
// already -inf); a row that sees no key gets zeros, as in the kernels.
torch::Tensor visible_softmax(const torch::Tensor& s) {
  torch::Tensor top = std::get<0>(s.max(-1, /*keepdim=*/true));
  top = torch::where(torch::isinf(top), torch::zeros_like(top), top);
  const torch::Tensor e = (s - top).exp();  // exp(-inf) = 0
  const torch::Tensor den = e.sum(-1, /*keepdim=*/true);
  return torch::where(den > 0, e / den, torch::zeros_like(e));
}

// The statistics of one head, summed over its query blocks.
struct HeadStats {
  torch::Tensor received, last_query, window;  // [m]
  torch::Tensor last_query_by_head;            // [R, m]
  torch::Tensor pooled_sum, pooled_max;        // [R, q_blocks, n_blocks]
};

struct ChunkShape {
  int64_t n, R, hd, pos0, window, B, q_blocks, n_blocks;
  double scale;
};

// One kv head: out [R, n, hd] and the wanted statistics.
torch::Tensor attend_head_blocked(const HeadRows& rows, const torch::Tensor& q, const ChunkShape& c,
                                  const DeviceStatsWanted& wanted, int64_t block, HeadStats* st) {
  const int64_t m = rows.pos.size(0);
  const auto f32 = q.options().dtype(torch::kFloat32);
  torch::Tensor out = torch::empty({c.R, c.n, c.hd}, f32);
  if (wanted.received) st->received = torch::zeros({m}, f32);
  if (wanted.last_query) st->last_query = torch::zeros({m}, f32);
  if (wanted.last_query_by_head) st->last_query_by_head = torch::zeros({c.R, m}, f32);
  if (wanted.window_end > wanted.window_begin) st->window = torch::zeros({m}, f32);
  if (c.B > 0) {
    st->pooled_sum = torch::zeros({c.R, c.q_blocks, c.n_blocks}, f32);
    st->pooled_max = torch::zeros({c.R, c.q_blocks, c.n_blocks}, f32);
  }
  if (m == 0) return out.zero_();  // a head that holds nothing: zeros, and no weight anywhere
  const torch::Tensor kpos = rows.pos.view({1, m});
  const torch::Tensor key_block = rows.pos.div(c.B > 0 ? c.B : 1, "floor");
  for (int64_t a = 0; a < c.n; a += block) {
    const int64_t b = std::min(c.n, a + block), nb = b - a;
    const torch::Tensor qpos =
        torch::arange(c.pos0 + a, c.pos0 + b, rows.pos.options()).view({nb, 1});
    // key_visible: causal by position, within the sliding window.
    torch::Tensor hidden = kpos > qpos;
    if (c.window > 0) hidden = hidden.logical_or(kpos <= qpos - c.window);
    torch::Tensor s = torch::matmul(q.narrow(1, a, nb), rows.keys.t()) * c.scale;  // [R, nb, m]
    s.masked_fill_(hidden.unsqueeze(0), kNegInf);
    const torch::Tensor p = visible_softmax(s);
    out.narrow(1, a, nb).copy_(torch::matmul(p, rows.values));
    if (st->received.defined()) st->received += p.sum(torch::IntArrayRef{0, 1});
    if (st->last_query.defined() && b == c.n) st->last_query += p.select(1, nb - 1).sum(0);
    if (st->last_query_by_head.defined() && b == c.n)
      st->last_query_by_head.copy_(p.select(1, nb - 1));
    const int64_t wa = std::max(a, wanted.window_begin), wb = std::min(b, wanted.window_end);
    if (st->window.defined() && wb > wa)
      st->window += p.narrow(1, wa - a, wb - wa).sum(torch::IntArrayRef{0, 1});
    if (c.B > 0) {
      // Key blocks first ([R, nb, n_blocks]), then query blocks.
      const torch::Tensor kb = key_block.view({1, 1, m}).expand({c.R, nb, m});
      const torch::Tensor by_key_sum =
          torch::zeros({c.R, nb, c.n_blocks}, f32).scatter_add_(2, kb, p);
      const torch::Tensor by_key_max =
          torch::zeros({c.R, nb, c.n_blocks}, f32).scatter_reduce_(2, kb, p, "amax");
      const torch::Tensor qb = (qpos.view({nb}).div(c.B, "floor") - c.pos0 / c.B)
                                   .view({1, nb, 1})
                                   .expand({c.R, nb, c.n_blocks});
      st->pooled_sum.scatter_add_(1, qb, by_key_sum);
      st->pooled_max.scatter_reduce_(1, qb, by_key_max, "amax");
    }
  }
  return out;
}

std::vector<float> to_host_floats(const torch::Tensor& t) {
  const torch::Tensor h = t.to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
}

}  // namespace

DeviceLayerAttention attend_layer_blocked(RaggedKvCache& cache, int64_t layer,
                                          const std::vector<int>& tiers,
                                          const std::vector<torch::Tensor>& pages,
                                          const torch::Tensor& q, int64_t pos0, double scale,
                                          int64_t window, const DeviceStatsWanted& wanted,
                                          int64_t max_weight_bytes) {
  const int64_t n = q.size(0), H = cache.n_heads(), K = cache.n_kv_heads(), R = H / K,
                hd = cache.head_dim();
  KVSCOPE_CHECK(!tiers.empty() && tiers.size() == pages.size(),
                "attend_layer_blocked: one page tensor per tier, at least one tier");
  for (size_t t = 0; t < tiers.size(); ++t) {
    const KvPool& pool = cache.pool(tiers[t]);
    KVSCOPE_CHECK(pool.key_dim() == hd, "attend_layer_blocked: tier " + std::to_string(tiers[t]) +
                                            " does not hold whole keys");
    KVSCOPE_CHECK(pages[t].defined() && pages[t].device() == q.device() &&
                      pages[t].size(1) == pool.page_bytes(),
                  "attend_layer_blocked: the pages of tier " + std::to_string(tiers[t]) +
                      " are not the tier's, on q's device");
  }
  const int64_t B = wanted.pooled_block;
  const ChunkShape c{n,
                     R,
                     hd,
                     pos0,
                     window,
                     B,
                     B > 0 ? (pos0 + n - 1) / B - pos0 / B + 1 : 0,
                     B > 0 ? (pos0 + n + B - 1) / B : 0,
                     scale};
  const torch::Tensor qd = q.reshape({n, K, R, hd}).permute({1, 2, 0, 3}).to(torch::kFloat32);

  const LayerRows held = layer_rows(cache, layer, tiers, q.device());
  DeviceLayerAttention result;
  result.key_pos = held.host_pos;
  for (int64_t h = 0; h <= K; ++h)
    result.row_begin.push_back(held.pos_begin[size_t(h * int64_t(tiers.size()))]);
  std::vector<torch::Tensor> outs;
  std::vector<HeadStats> stats(static_cast<size_t>(K));
  for (int64_t h = 0; h < K; ++h) {
    const HeadRows rows = gather_rows(cache, held, h, tiers, pages);
    const int64_t m = std::max<int64_t>(1, rows.pos.size(0));
    const int64_t block = std::clamp<int64_t>(max_weight_bytes / (R * m * 4), 1, n);
    outs.push_back(attend_head_blocked(rows, qd[h], c, wanted, block, &stats[size_t(h)]));
  }
  result.out = torch::stack(outs).permute({2, 0, 1, 3}).reshape({n, H, hd}).contiguous();

  // Host copies, heads in order as the kernels lay them out.
  auto concat = [&](torch::Tensor HeadStats::*field) {
    std::vector<torch::Tensor> parts;
    for (const HeadStats& s : stats)
      if ((s.*field).defined()) parts.push_back((s.*field).flatten());
    return parts.empty() ? std::vector<float>() : to_host_floats(torch::cat(parts));
  };
  if (wanted.received) result.received = concat(&HeadStats::received);
  if (wanted.last_query) result.last_query = concat(&HeadStats::last_query);
  if (wanted.window_end > wanted.window_begin) result.window = concat(&HeadStats::window);
  if (wanted.last_query_by_head) result.last_query_by_head = concat(&HeadStats::last_query_by_head);
  if (B > 0) {
    result.q_blocks = c.q_blocks;
    result.n_blocks = c.n_blocks;
    result.pooled_sum = concat(&HeadStats::pooled_sum);
    result.pooled_max = concat(&HeadStats::pooled_max);
  }
  return result;
}

}  // namespace kvscope::cache
