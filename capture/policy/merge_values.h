// Merge-on-evict (kvpress MergingPress; Token Merging, Bolya et al., ICLR
// 2023; D2O, Wan et al., 2024): instead of dropping an entry's value, fold it
// into the surviving entry whose key is most similar. docs/policies/merging.md
#pragma once

#include <cstdint>
#include <vector>

#include "capture/policy/policy.h"

namespace kvscope::policy {

struct MergeOptions {
  double threshold = 0.0;  // least cosine similarity for a merge
  double fraction = 1.0;   // share of the leaving entries (most similar first) merged
};

// Before `leaving` (positions head (c.layer, kv_head) holds in tier 0) are
// evicted: each leaving entry e finds the survivor t of largest cos(k_e, k_t)
// (keys as cached); if the similarity passes `threshold` (and ranks in the
// top `fraction` of the head's similarities) it weighs
//   w_e = max(cos, 0) ||v_e|| / (||v_e|| + ||v_t|| + 1e-6),
// and every survivor t that absorbed some becomes
//   v_t' = (v_t + sum_e w_e v_e) / (1 + sum_e w_e).
// Keys stay (RoPE-safe). Each merge is recorded (Decisions::merge, the trace's
// /merges); the evictions themselves are the caller's.
void merge_on_evict(LayerContext& c, int64_t kv_head, const std::vector<int64_t>& leaving,
                    const MergeOptions& o);

}  // namespace kvscope::policy
