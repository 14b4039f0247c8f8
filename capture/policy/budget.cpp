#include "capture/policy/budget.h"

#include <algorithm>
#include <limits>

namespace kvscope::policy {

std::vector<int64_t> evictable(const Decisions& decide, int64_t layer, int64_t kv_head,
                               const Protection& protect, int tier) {
  std::vector<int64_t> out;
  const int64_t fed = decide.tokens_fed();
  for (int32_t pos : decide.cache().positions(layer, kv_head, tier))
    if (!protect.protects(pos, fed)) out.push_back(pos);
  return out;
}

int64_t evict_to_budget(Decisions& decide, int64_t layer, int64_t kv_head, int64_t keep,
                        const Protection& protect, const float* score_by_pos, uint16_t reason,
                        int tier) {
  const std::vector<int64_t> out =
      lowest_to_budget(decide, layer, kv_head, keep, protect, score_by_pos, tier);
  evict_all(decide, layer, kv_head, out, score_by_pos, reason);
  return int64_t(out.size());
}

std::vector<int64_t> lowest_to_budget(const Decisions& decide, int64_t layer, int64_t kv_head,
                                      int64_t keep, const Protection& protect,
                                      const float* score_by_pos, int tier) {
  int64_t excess = decide.cache().count(layer, kv_head, tier) - keep;
  if (excess <= 0) return {};
  std::vector<int64_t> candidates = evictable(decide, layer, kv_head, protect, tier);
  excess = std::min<int64_t>(excess, static_cast<int64_t>(candidates.size()));
  auto lower = [&](int64_t a, int64_t b) {
    float sa = score_by_pos[a], sb = score_by_pos[b];
    return sa < sb || (sa == sb && a < b);
  };
  std::partial_sort(candidates.begin(), candidates.begin() + excess, candidates.end(), lower);
  candidates.resize(size_t(excess));
  // Recorded in position order: the set is the decision; an order by score
  // would follow rounding-level differences between near-equal scores, which
  // differ between CPUs (AMD EPYC vs Intel Xeon), and the trace would too.
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

void evict_all(Decisions& decide, int64_t layer, int64_t kv_head,
               const std::vector<int64_t>& positions, const float* score_by_pos, uint16_t reason) {
  for (int64_t pos : positions)
    decide.evict(layer, kv_head, pos,
                 score_by_pos ? score_by_pos[pos] : std::numeric_limits<float>::quiet_NaN(),
                 reason);
}

}  // namespace kvscope::policy
