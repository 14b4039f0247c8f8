// What the writer derives from the events as they come: each head's admit and
// evict step per token and, for tiered policies, each token's residences per
// tier. Derived here, once, so a trace cannot hold a lifetime that
// contradicts its events; the writer only stores what this analysis holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/trace/types.h"

namespace kvscope::trace {

// Dirty token range of one head's row in a [L, K, T] array.
struct DirtyRange {
  int64_t lo = INT64_MAX;
  int64_t hi = 0;
  void mark(int64_t t) {
    lo = std::min(lo, t);
    hi = std::max(hi, t + 1);
  }
  bool empty() const { return lo >= hi; }
  void clear() {
    lo = INT64_MAX;
    hi = 0;
  }
};

// An in-memory [slots, tokens] array (slot = layer * K + kv head) that grows
// along tokens, with the token range of each slot changed since the last
// write.
template <typename T>
struct HeadTokenArray {
  int64_t slots = 0;     // L * K
  int64_t capacity = 0;  // tokens allocated per slot
  int64_t tokens = 0;    // tokens on the axis
  T fill{};
  std::vector<T> data;  // slot-major: [slot * capacity + t]
  std::vector<DirtyRange> dirty;

  void init(int64_t n_slots, T fill_value) {
    slots = n_slots;
    fill = fill_value;
    dirty.assign(static_cast<size_t>(slots), DirtyRange{});
  }
  void grow_to(int64_t n_tokens) {
    if (n_tokens <= tokens) return;
    if (n_tokens > capacity) {
      int64_t cap = std::max<int64_t>(n_tokens, std::max<int64_t>(1024, capacity * 2));
      std::vector<T> next(static_cast<size_t>(slots * cap), fill);
      for (int64_t s = 0; s < slots; ++s)
        std::copy_n(data.begin() + s * capacity, tokens, next.begin() + s * cap);
      data.swap(next);
      capacity = cap;
    }
    tokens = n_tokens;
  }
  T& at(int64_t slot, int64_t t) { return data[static_cast<size_t>(slot * capacity + t)]; }
  void set(int64_t slot, int64_t t, T value) {
    at(slot, t) = value;
    dirty[static_cast<size_t>(slot)].mark(t);
  }
};

class LifetimeTracker {
 public:
  // kv_heads: K; tiered: whether tier residences are tracked (R > 1).
  void init(int64_t layers, int64_t kv_heads, bool tiered);
  // Makes room for tokens [0, n_tokens).
  void grow_to(int64_t n_tokens);
  // Takes one event, in the order of the trace (events already checked).
  void observe(const Event& e);

  HeadTokenArray<int32_t>& admit() { return admit_; }
  HeadTokenArray<int32_t>& evict() { return evict_; }
  // Residences that ended, in the order they ended.
  const std::vector<TierInterval>& closed_intervals() const { return closed_; }
  // Every residence, those still open included, sorted by (layer, kv head,
  // token, begin), and the per-head index into them (L * K + 1 rows).
  std::vector<TierInterval> all_intervals() const;
  std::vector<int64_t> interval_index(const std::vector<TierInterval>& sorted) const;

 private:
  void open_interval(int64_t slot, const Event& e, uint8_t tier);
  void close_interval(int64_t slot, int32_t token, int32_t step);

  int64_t L_ = 0, K_ = 0;
  bool tiered_ = false;
  HeadTokenArray<int32_t> admit_, evict_;
  std::unordered_map<int64_t, TierInterval> open_;  // key: slot * 2^32 + token
  std::vector<TierInterval> closed_;
};

}  // namespace kvscope::trace
