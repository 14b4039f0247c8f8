// The one current state every view follows (RenderDoc's "current event"):
// trace, step, layer, query head, selected tokens, compared trace. No view
// owns it. A change made by one view is announced to every other observer —
// never back to the one that made it, so a view does not redo the work it
// just did. Plain C++ so it is testable without a window or event loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::views {

struct Selection {
  std::string trace;    // path of the current trace ("" when none)
  std::string compare;  // path of the compared trace ("" when none)
  int layer = 0;
  int head = 0;  // query head; its kv head is head / (H / K)
  int64_t step = 0;
  std::vector<int64_t> tokens;  // selected token indices, sorted, unique
  // Shape of the current trace, for clamping and kv-head arithmetic.
  int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, n_steps = 0, n_tokens = 0;

  int kv_head() const {
    int64_t group = n_kv_heads > 0 && n_heads >= n_kv_heads ? n_heads / n_kv_heads : 1;
    return int(head / std::max<int64_t>(1, group));
  }
  int64_t token() const { return tokens.empty() ? -1 : tokens.front(); }
};

enum Change : uint32_t {
  kTraceChanged = 1u << 0,  // another trace became current (everything changed)
  kStepChanged = 1u << 1,
  kHeadChanged = 1u << 2,  // layer and/or head
  kTokensChanged = 1u << 3,
  kCompareChanged = 1u << 4,
  kTraceGrew = 1u << 5,  // a live trace has new steps
};

class StateObserver {
 public:
  virtual ~StateObserver() = default;
  virtual void state_changed(const Selection& selection, uint32_t changes) = 0;
};

class CurrentState {
 public:
  void attach(StateObserver* observer);
  void detach(StateObserver* observer);
  const Selection& selection() const { return sel_; }

  // Each setter clamps to the trace's shape, and notifies every observer but
  // `source` when something really changed. Returns the changes made.
  uint32_t set_trace(const std::string& path, int64_t layers, int64_t heads, int64_t kv_heads,
                     int64_t steps, int64_t tokens, StateObserver* source = nullptr);
  uint32_t set_extent(int64_t steps, int64_t tokens, StateObserver* source = nullptr);
  uint32_t set_step(int64_t step, StateObserver* source = nullptr);
  uint32_t set_head(int layer, int head, StateObserver* source = nullptr);
  uint32_t set_tokens(std::vector<int64_t> tokens, StateObserver* source = nullptr);
  uint32_t set_compare(const std::string& path, StateObserver* source = nullptr);

 private:
  uint32_t notify(uint32_t changes, StateObserver* source);
  Selection sel_;
  std::vector<StateObserver*> observers_;
};

}  // namespace kvscope::views
