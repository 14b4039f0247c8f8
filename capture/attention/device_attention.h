// One layer's attention on the device (--device cuda): the CUDA kernels of
// kernels/cuda read the ragged cache's mirrored pages (KvPool::mirror_to) in
// place, through per-head page tables built from the cache's host metadata,
// and only the statistics a step asks for come back to the host: per held row
// the weight it received, per block the pooled weights, never the [n, rows]
// weights. What needs the weights themselves (dense rows, top-k, selection
// masks) stays on the host path (RaggedKvCache::attend_head), which the step
// driver takes for such layers.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "capture/cache/ragged_cache.h"

namespace kvscope::cache {

// Whether this build compiled the CUDA kernels.
bool device_attention_compiled();

// Per held row, weights summed over the group's query heads and over queries
// of the step: all of them, the last one, and queries [window_begin,
// window_end) (empty: not computed).
// pooled_block > 0: per query head, query block and key block of that many
// positions, the sum and the largest weight (the kernels' pooled passes).
struct DeviceStatsWanted {
  bool received = false;
  bool last_query = false;
  int64_t window_begin = 0, window_end = 0;
  int64_t pooled_block = 0;
  // Per query head, the step's last query's weights on each held row.
  bool last_query_by_head = false;
};

// How a prefill chunk (more than one query) is attended on the device: the
// flash-style CUDA kernel with its statistics passes, or query blocks of
// matrix products with the statistics read off each block's weights
// (blocked_attention.h). Decode steps always take the decode kernel.
enum class DevicePrefill { Kernel, Blocked };

// "kernel" / "blocked"; anything else is an InputError naming --device-prefill.
DevicePrefill parse_device_prefill(const std::string& text);

struct DeviceLayerAttention {
  torch::Tensor out;               // [n, H, hd] float32, on the device
  std::vector<int64_t> row_begin;  // [K + 1]: head h holds rows row_begin[h] ..
  std::vector<int64_t> key_pos;    // per row its position (each head in slot order)
  std::vector<float> received, last_query, window;  // per row, when wanted
  // When wanted: head h's [R, rows_h] block at R * row_begin[h] (the decode
  // kernel's probs layout), each query head's row in slot order.
  std::vector<float> last_query_by_head;
  // Pooled weights, when wanted: [K, R, q_blocks, n_blocks], key block kb
  // holding positions kb * block ..; query block 0 holds position pos0.
  std::vector<float> pooled_sum, pooled_max;
  int64_t q_blocks = 0, n_blocks = 0;
};

// Attention of the step's queries q [n, H, hd] (on the device, positions
// pos0 ..) over what `tier` (RaggedKvCache::device_tier) holds in `layer`,
// the step's own entries included; uploads the pages written since the last
// call first. Throws std::runtime_error naming the kernel when a launch fails.
DeviceLayerAttention attend_layer_on_device(RaggedKvCache& cache, int64_t layer, int tier,
                                            const torch::Tensor& q, int64_t pos0, double scale,
                                            int64_t window, const DeviceStatsWanted& wanted,
                                            DevicePrefill prefill = DevicePrefill::Kernel);

}  // namespace kvscope::cache
