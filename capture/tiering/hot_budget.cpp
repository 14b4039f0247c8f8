#include "capture/tiering/hot_budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace kvscope::tiering {

std::vector<int64_t> allocate_by_volatility(int64_t budget, const std::vector<double>& volatility,
                                            const std::vector<int64_t>& floor) {
  const size_t n = volatility.size();
  if (floor.size() != n) throw std::invalid_argument("allocate_by_volatility: sizes differ");
  const int64_t floors = std::accumulate(floor.begin(), floor.end(), int64_t(0));
  if (budget < floors)
    throw std::invalid_argument("allocate_by_volatility: budget " + std::to_string(budget) +
                                " below the floors' sum " + std::to_string(floors));
  double total = 0;
  for (double v : volatility) total += std::isfinite(v) && v > 0 ? v : 0.0;
  const int64_t rest = budget - floors;
  std::vector<int64_t> out(floor);
  std::vector<std::pair<double, size_t>> remainder;
  int64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = std::isfinite(volatility[i]) && volatility[i] > 0 ? volatility[i] : 0.0;
    const double share = total > 0 ? double(rest) * v / total : double(rest) / double(n);
    const int64_t whole = int64_t(std::floor(share));
    out[i] += whole;
    given += whole;
    remainder.push_back({share - double(whole), i});
  }
  // Largest remainders first, ties to the lower head: deterministic.
  std::sort(remainder.begin(), remainder.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (int64_t k = 0; k < rest - given; ++k) ++out[remainder[size_t(k) % n].second];
  return out;
}

}  // namespace kvscope::tiering
