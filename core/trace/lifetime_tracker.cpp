#include "core/trace/lifetime_tracker.h"

#include <tuple>

namespace kvscope::trace {

void LifetimeTracker::init(int64_t layers, int64_t kv_heads, bool tiered) {
  L_ = layers;
  K_ = kv_heads;
  tiered_ = tiered;
  admit_.init(L_ * K_, -1);
  evict_.init(L_ * K_, -1);
}

void LifetimeTracker::grow_to(int64_t n_tokens) {
  admit_.grow_to(n_tokens);
  evict_.grow_to(n_tokens);
}

void LifetimeTracker::observe(const Event& e) {
  const int64_t slot = int64_t(e.layer) * K_ + e.kv_head;
  switch (e.kind) {
    case EventKind::Admit:
      admit_.set(slot, e.token, e.step);
      open_interval(slot, e, e.to_tier == kNoTier ? 0 : e.to_tier);
      break;
    case EventKind::Evict:
      evict_.set(slot, e.token, e.step);
      close_interval(slot, e.token, e.step);
      break;
    case EventKind::Demote:
    case EventKind::Promote:
      close_interval(slot, e.token, e.step);
      open_interval(slot, e, e.to_tier);
      break;
    case EventKind::Reject:
    case EventKind::Select: break;
  }
}

void LifetimeTracker::open_interval(int64_t slot, const Event& e, uint8_t tier) {
  if (!tiered_) return;
  open_[(slot << 32) | static_cast<uint32_t>(e.token)] =
      TierInterval{e.layer, e.kv_head, e.token, tier, e.step, -1};
}

void LifetimeTracker::close_interval(int64_t slot, int32_t token, int32_t step) {
  if (!tiered_) return;
  auto it = open_.find((slot << 32) | static_cast<uint32_t>(token));
  if (it == open_.end()) return;
  it->second.end_step = step;
  closed_.push_back(it->second);
  open_.erase(it);
}

std::vector<TierInterval> LifetimeTracker::all_intervals() const {
  std::vector<TierInterval> all = closed_;
  for (const auto& [key, iv] : open_) all.push_back(iv);
  std::sort(all.begin(), all.end(), [](const TierInterval& a, const TierInterval& b) {
    return std::tie(a.layer, a.kv_head, a.token, a.begin_step) <
           std::tie(b.layer, b.kv_head, b.token, b.begin_step);
  });
  return all;
}

std::vector<int64_t> LifetimeTracker::interval_index(
    const std::vector<TierInterval>& sorted) const {
  std::vector<int64_t> index(static_cast<size_t>(L_ * K_ + 1), 0);
  for (const TierInterval& iv : sorted)
    ++index[static_cast<size_t>(iv.layer * K_ + iv.kv_head) + 1];
  for (size_t i = 1; i < index.size(); ++i) index[i] += index[i - 1];
  return index;
}

}  // namespace kvscope::trace
