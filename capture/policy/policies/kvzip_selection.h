// KVzip's end of prefill, shared with Fast KVzip (kvzip.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "capture/policy/decisions.h"

namespace kvscope::policy {

// Records scores [L][K][T] as gate 0 of every entry and evicts what
// kvzip_evictions (descriptors.h) picks, with reason 1: the L*K*(T - budget)
// lowest over all layers and heads, or K*(T - budget) per layer.
void record_and_evict_lowest(Decisions& decide, const std::vector<float>& scores, int64_t L,
                             int64_t K, int64_t T, int64_t budget, bool layerwise);

}  // namespace kvscope::policy
