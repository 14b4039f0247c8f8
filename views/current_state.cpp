#include "views/current_state.h"

#include <algorithm>

namespace kvscope::views {

void CurrentState::attach(StateObserver* o) {
  if (std::find(observers_.begin(), observers_.end(), o) == observers_.end())
    observers_.push_back(o);
}

void CurrentState::detach(StateObserver* o) {
  observers_.erase(std::remove(observers_.begin(), observers_.end(), o), observers_.end());
}

uint32_t CurrentState::notify(uint32_t changes, StateObserver* source) {
  if (changes == 0) return 0;
  // Copy: an observer may attach or detach others while being told.
  std::vector<StateObserver*> observers = observers_;
  for (StateObserver* o : observers)
    if (o != source) o->state_changed(sel_, changes);
  return changes;
}

uint32_t CurrentState::set_trace(const std::string& path, int64_t layers, int64_t heads,
                                 int64_t kv_heads, int64_t steps, int64_t tokens,
                                 StateObserver* source) {
  bool same = path == sel_.trace;
  sel_.trace = path;
  sel_.n_layers = layers;
  sel_.n_heads = heads;
  sel_.n_kv_heads = kv_heads;
  sel_.n_steps = steps;
  sel_.n_tokens = tokens;
  if (!same) {
    sel_.tokens.clear();
    if (sel_.compare == path) sel_.compare.clear();
  }
  sel_.layer = int(std::clamp<int64_t>(sel_.layer, 0, std::max<int64_t>(0, layers - 1)));
  sel_.head = int(std::clamp<int64_t>(sel_.head, 0, std::max<int64_t>(0, heads - 1)));
  sel_.step = std::clamp<int64_t>(same ? sel_.step : steps - 1, 0, std::max<int64_t>(0, steps - 1));
  return notify(kTraceChanged | kStepChanged | kHeadChanged | kTokensChanged, source);
}

uint32_t CurrentState::set_extent(int64_t steps, int64_t tokens, StateObserver* source) {
  if (steps == sel_.n_steps && tokens == sel_.n_tokens) return 0;
  sel_.n_steps = steps;
  sel_.n_tokens = tokens;
  return notify(kTraceGrew, source);
}

uint32_t CurrentState::set_step(int64_t step, StateObserver* source) {
  step = std::clamp<int64_t>(step, 0, std::max<int64_t>(0, sel_.n_steps - 1));
  if (step == sel_.step) return 0;
  sel_.step = step;
  return notify(kStepChanged, source);
}

uint32_t CurrentState::set_head(int layer, int head, StateObserver* source) {
  layer = int(std::clamp<int64_t>(layer, 0, std::max<int64_t>(0, sel_.n_layers - 1)));
  head = int(std::clamp<int64_t>(head, 0, std::max<int64_t>(0, sel_.n_heads - 1)));
  if (layer == sel_.layer && head == sel_.head) return 0;
  sel_.layer = layer;
  sel_.head = head;
  return notify(kHeadChanged, source);
}

uint32_t CurrentState::set_tokens(std::vector<int64_t> tokens, StateObserver* source) {
  tokens.erase(std::remove_if(tokens.begin(), tokens.end(),
                              [&](int64_t t) { return t < 0 || t >= sel_.n_tokens; }),
               tokens.end());
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  if (tokens == sel_.tokens) return 0;
  sel_.tokens = std::move(tokens);
  return notify(kTokensChanged, source);
}

uint32_t CurrentState::set_compare(const std::string& path, StateObserver* source) {
  if (path == sel_.compare) return 0;
  sel_.compare = path;
  return notify(kCompareChanged, source);
}

}  // namespace kvscope::views
