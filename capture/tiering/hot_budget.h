// Head-adaptive hot budgets (seed 004, "Component three"): a layer's hot-tier
// entries shared among its kv heads in proportion to each head's forecast
// volatility, every head keeping at least its floor (its pinned sinks and
// window), the shares summing exactly to the layer's budget (largest
// remainders).
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope::tiering {

// budget >= sum(floor) expected (std::invalid_argument otherwise); a zero or
// non-finite total volatility shares the rest uniformly.
std::vector<int64_t> allocate_by_volatility(int64_t budget, const std::vector<double>& volatility,
                                            const std::vector<int64_t>& floor);

}  // namespace kvscope::tiering
