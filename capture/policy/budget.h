// Reusable pieces of the training-free policies: protected sinks and recent
// windows, and "evict the lowest scores until the head fits its budget".
#pragma once

#include <cstdint>
#include <vector>

#include "capture/cache/ragged_cache.h"
#include "capture/policy/decisions.h"

namespace kvscope::policy {

// The first `sinks` positions and the last `recent` positions fed are never
// evicted (StreamingLLM's attention sinks, H2O's recent window).
struct Protection {
  int64_t sinks = 0;
  int64_t recent = 0;
  bool protects(int64_t pos, int64_t fed) const { return pos < sinks || pos >= fed - recent; }
};

// Held, unprotected positions of head (layer, kv_head) in `tier`.
std::vector<int64_t> evictable(const Decisions& decide, int64_t layer, int64_t kv_head,
                               const Protection& protect, int tier = 0);

// Evicts the lowest-scored unprotected entries of the head until it holds at
// most `keep` entries in `tier`. score_by_pos is indexed by position; ties go
// to the older position. The evictions are recorded in position order.
// Returns the number evicted.
int64_t evict_to_budget(Decisions& decide, int64_t layer, int64_t kv_head, int64_t keep,
                        const Protection& protect, const float* score_by_pos, uint16_t reason,
                        int tier = 0);

// The positions evict_to_budget would evict, in position order.
std::vector<int64_t> lowest_to_budget(const Decisions& decide, int64_t layer, int64_t kv_head,
                                      int64_t keep, const Protection& protect,
                                      const float* score_by_pos, int tier = 0);

// Evicts the given positions in order, recording score_by_pos as the score.
void evict_all(Decisions& decide, int64_t layer, int64_t kv_head,
               const std::vector<int64_t>& positions, const float* score_by_pos, uint16_t reason);

// Per-(layer, kv head) float arrays indexed by position, for policy state.
class HeadScores {
 public:
  void resize(int64_t layers, int64_t kv_heads, int64_t max_tokens, float fill = 0.0f) {
    K_ = kv_heads;
    M_ = max_tokens;
    data_.assign(size_t(layers * kv_heads * max_tokens), fill);
  }
  float* at(int64_t layer, int64_t kv_head) { return data_.data() + (layer * K_ + kv_head) * M_; }
  const float* at(int64_t layer, int64_t kv_head) const {
    return data_.data() + (layer * K_ + kv_head) * M_;
  }

 private:
  int64_t K_ = 0, M_ = 0;
  std::vector<float> data_;
};

}  // namespace kvscope::policy
