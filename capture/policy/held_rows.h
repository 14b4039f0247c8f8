// The entries a head holds, as tensors, for scorers that compute on keys and
// values (kvpress's presses see the cache as [K, T, hd] tensors in position
// order; KVScope's ragged cache keeps slot order, so this gathers and sorts).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "capture/cache/ragged_cache.h"
#include "capture/model/model_config.h"
#include "capture/model/rope.h"

namespace kvscope::policy {

struct HeldRows {
  std::vector<int32_t> pos;  // ascending
  torch::Tensor keys;        // [m, hd] float32, as cached (after RoPE)
  torch::Tensor values;      // [m, hd] float32
  int64_t size() const { return int64_t(pos.size()); }
};

// Every entry head (layer, kv_head) holds in `tier`, in position order.
HeldRows held_rows(const cache::RaggedKvCache& cache, int64_t layer, int64_t kv_head,
                   int64_t tier = 0);

// The rows of `all` at `positions` (sorted, each held in `all`).
HeldRows subset_rows(const HeldRows& all, const std::vector<int64_t>& positions);

// Undoes RoPE on cached keys (RoPE rotates channel pairs, so the inverse
// rotation recovers the pre-RoPE key up to float rounding). Models without
// RoPE (learned positions) pass keys through.
class RopeInverse {
 public:
  explicit RopeInverse(const model::ModelConfig& config);
  // keys [m, hd] rotated back by `pos` positions each (R(-pos) k) in a
  // sequence of `seq_len` tokens: at their own positions, the pre-RoPE keys;
  // by fewer, the keys as RoPE puts them at an earlier position (rerotate).
  torch::Tensor operator()(const torch::Tensor& keys, const std::vector<int32_t>& pos,
                           int64_t seq_len);

 private:
  std::unique_ptr<model::Rope> rope_;
  double rope_factor_ = 1.0;  // LongRoPE's attention factor, in the tables
};

// x [m] standardised over its own entries as torch does it (unbiased std):
// (x - mean) / max(std, 1e-6).
torch::Tensor z_score(const torch::Tensor& x);

}  // namespace kvscope::policy
