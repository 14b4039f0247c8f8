// Prefill attention by query blocks and matrix products, with the capture's
// statistics read off each block's weights: the second way to attend a
// prefill chunk on the device (--device-prefill blocked), beside the
// flash-style CUDA kernel (device_attention.h).
//
// Why a second way: the kernel is a plain float32 loop without tensor cores
// and recomputes every weight once more for the received mass and once per
// key block for the pooled maps (docs/performance.md "GPU kernels": 4.4x
// SDPA fp32's time at 8K, the pooled pass 1.6x the forward). Here each kv
// head's held rows are gathered from its pages into [m, hd], and each block
// of queries is two cuBLAS products around a softmax: the weights
// [R, block, m] exist once per block, and the received mass, the last query,
// the observation window and the pooled maps are sums and maxima over them.
// The block is sized so the weights stay under a fixed budget of memory.
// It is also the device's way for layers whose caches have several attended
// tiers or an INT4 tier, prefill and decode alike (below).
//
// The definitions are the kernels': key_visible (kernels/softmax_rules.h)
// decides what a query sees, a query that sees no key gets zeros, pooled
// blocks are by position. The exp is ATen's, not exp_nonpositive: weights
// agree with the kernels' to a float's rounding, not bit for bit.
//
// Only tensor operations: it runs on whatever device the pages and q are on,
// so the CPU tests check it against the host kernels, and on a GPU it is the
// same code.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "capture/attention/device_attention.h"
#include "capture/cache/ragged_cache.h"

namespace kvscope::cache {

// Attention of the step's queries q [n, H, hd] (positions pos0 ..; a
// prefill chunk, or a decode step's single query) over what `tiers` hold in
// `layer`, reading each tier's pages from `pages` (the same order: KvPool's
// host_pages() or mirror_pages(), uint8 [capacity, page_bytes], on q's
// device). The tiers must hold whole keys, float32 or INT4 (dequantised as
// the CPU does). Several tiers are one softmax over all their rows, as on the
// host path: the policies whose caches have several attended tiers (WG-KV,
// KVpop, SFC's INT4 warm tier) are read on the device this way, which the
// CUDA kernels (one float32 tier) cannot. The result is laid out as
// attend_layer_on_device's: per head its rows, each tier's in slot order,
// the tiers in order; `out` [n, H, hd] float32 on q's device, the statistics
// on the host. max_weight_bytes bounds each block's weights (R x block x m
// floats).
DeviceLayerAttention attend_layer_blocked(RaggedKvCache& cache, int64_t layer,
                                          const std::vector<int>& tiers,
                                          const std::vector<torch::Tensor>& pages,
                                          const torch::Tensor& q, int64_t pos0, double scale,
                                          int64_t window, const DeviceStatsWanted& wanted,
                                          int64_t max_weight_bytes = int64_t(256) << 20);

}  // namespace kvscope::cache
