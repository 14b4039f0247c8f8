// The one way a policy's decisions reach the cache. Policies read the cache
// (const) and write decisions here: evictions, tier moves, read-time
// selections and gate values, each with a score and a reason. Every decision
// is checked (layer, head and tier exist, the position is held) before it is
// applied to the storage, and recorded as a trace event in this one place. An
// invalid decision throws PolicyError naming the policy (the part of a
// composite), the decision, layer, head and position: the capture stops and
// the trace so far stays readable.
//
// Composites: each part numbers its reasons, gates and series from its own 0; the
// step driver enters a part's scope before calling it, and the scope maps the
// part's numbers onto the composite's tables.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "capture/cache/ragged_cache.h"
#include "capture/policy/interventions.h"
#include "core/trace/types.h"

namespace kvscope::policy {

// A policy decided something the cache cannot do (a bug in the policy, not
// bad input): the capture stops with this message.
class PolicyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How one part's reason, gate and series numbers map onto the composite's tables.
struct PartScope {
  std::string name;          // the part's spec name, for errors
  uint16_t reason_base = 1;  // part reason r > 0 -> reason_base + r - 1 (0, "new token", is shared)
  uint16_t reasons = 1;      // the part's reason count (its own 0 included)
  int32_t gate_base = 0;     // part gate g -> gate_base + g
  int32_t gates = 0;         // the part's gate count
  int32_t series_base = 0;   // part series s -> series_base + s
  int32_t series = 0;        // the part's series count
};

class Decisions {
 public:
  // `reasons`, `gates` and `series`: how many the policy declares (its tables' sizes).
  Decisions(cache::RaggedKvCache& cache, std::string policy_name, uint16_t reasons, int32_t gates,
            int32_t series);

  // ---- what a policy reads ----
  const cache::RaggedKvCache& cache() const { return cache_; }
  int64_t step() const { return step_; }
  int64_t tokens_fed() const { return pos0_ + n_; }  // after the current step

  // ---- what a policy decides (each recorded as an event of the step) ----
  void evict(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason);
  // Moves a held entry to `to_tier` (nothing when it is there already).
  void move(int64_t layer, int64_t kv_head, int64_t pos, int to_tier, float score, uint16_t reason);
  // Records that queries of this step read `pos` by the policy's selection
  // (a page is named by its first position, which may have left).
  void select(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason);
  // A gate value (the policy's score of an entry), a time-series sample or
  // not. Inline: scored policies record one per held entry and step.
  void gate(int32_t gate, int64_t layer, int64_t kv_head, int64_t pos, float value, bool sample) {
    if (uint64_t(layer) >= uint64_t(L_) || uint64_t(kv_head) >= uint64_t(K_) ||
        uint64_t(pos) >= uint64_t(pos0_ + n_) || uint32_t(gate) >= uint32_t(scope_->gates))
      gate_error(gate, layer, kv_head, pos);
    gates_.push_back(trace::GateValue{scope_->gate_base + gate, static_cast<int16_t>(layer),
                                      static_cast<int16_t>(kv_head), static_cast<int32_t>(pos),
                                      value, sample});
  }

  // The value of series `index` for head (layer, kv_head) at this step; a
  // later value for the same series and head in the step replaces it.
  void series(int32_t index, int64_t layer, int64_t kv_head, float value);

  // Records that this step waited `wait_s` seconds (modelled or measured) for
  // a reactive fetch of `pos` from a tier the policy does not attend (the
  // trace's /stalls; the capture fills in the oracle's verdict). Moving the
  // entry is a separate move().
  void stall(int64_t layer, int64_t kv_head, int64_t pos, float wait_s);

  // Folds entry `pos` into entry `into` of the same head before `pos` leaves:
  // `into`'s value becomes `value` (the policy's blend) and the trace's
  // /merges records (pos -> into, weight). The eviction of `pos` is a
  // separate evict(); a second merge into the same entry in a step replaces
  // the value again (pass the blend of all of them).
  void merge(int64_t layer, int64_t kv_head, int64_t pos, int64_t into, float weight,
             const float* value);

  // Re-rotates the cached key of `pos` so that it carries RoPE position
  // `position` (the policy computes `key`, the rotated key); the trace's
  // /rerotations records it. The entry stays where it is.
  void rerotate(int64_t layer, int64_t kv_head, int64_t pos, int64_t position, const float* key);

  // Sets the key channels head (layer, kv_head) keeps in the tiers that prune
  // channels (ThinK): `pruned` (ascending, each < head_dim) are dropped, as
  // many as those tiers drop; the head must hold nothing in them yet. The
  // trace's /key_channels records each pruned channel. Entries enter those
  // tiers by move() or admission afterwards.
  void prune_key_channels(int64_t layer, int64_t kv_head, const std::vector<int32_t>& pruned);

  // ---- a replay's interventions (interventions.h) ----
  // From now on, what `iv` keeps of the policy's evictions, rejections and
  // demotions to unread tiers moves to `kept_tier` instead (a demote event
  // with reason `kept_reason`), a decision about an entry there or one
  // dropped is no-op, and drop() records `drop_reason`; each change is an
  // /interventions row.
  void set_interventions(const Interventions* iv, int kept_tier, uint16_t kept_reason,
                         uint16_t drop_reason);
  // Evicts held `pos` at (layer, kv_head) for intervention `which` (an
  // evict event with the drop reason); nothing when it is not held or kept.
  void drop(int64_t layer, int64_t kv_head, int64_t pos, int which);
  std::vector<trace::InterventionRow> take_interventions();

  // ---- what the step driver does ----
  void begin_step(int64_t step, int64_t pos0, int64_t n);
  void enter(const PartScope* scope) { scope_ = scope ? scope : &whole_; }
  uint16_t map_reason(uint16_t reason, const char* decision) const;
  // Writes a new entry (admitted, or rejected: kept for the step's own queries).
  void write(int64_t layer, int64_t kv_head, int64_t pos, int tier, const float* k, const float* v);
  void admit(int64_t layer, int64_t kv_head, int64_t pos, int tier, float score, uint16_t reason);
  void reject(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason);
  // Throws PolicyError naming the policy and `what` (layer, head, position).
  [[noreturn]] void fail(const std::string& decision, int64_t layer, int64_t kv_head, int64_t pos,
                         const std::string& why) const;
  // While the selection runs, entries must stay where they are (the masks
  // index the attended entries as they were listed): evict and move refuse.
  void lock_storage(bool locked) { storage_locked_ = locked; }

  std::vector<trace::Event> take_events();
  std::vector<trace::GateValue> take_gates();
  // This step's series values, [series][layer][kv head] (NaN where none was
  // recorded); empty when none was recorded (trace::StepData::series).
  std::vector<float> take_series();
  // The stalls recorded since the last take (trace::StepData::stalls).
  std::vector<trace::StallRow> take_stalls();
  std::vector<trace::MergeRow> take_merges();
  std::vector<trace::RerotationRow> take_rerotations();
  std::vector<trace::KeyChannelRow> take_key_channels();

 private:
  // An intervention keeps what the policy takes: moves it to the kept tier.
  bool kept_instead(int64_t layer, int64_t kv_head, int64_t pos, int tier,
                    trace::EventKind decision, float score, uint16_t reason);
  bool moot(int64_t layer, int64_t kv_head, int64_t pos) const;
  void intervention_row(int64_t layer, int64_t kv_head, int64_t pos, trace::InterventionAction a,
                        trace::EventKind decision, uint16_t reason, int which, float score);
  [[noreturn]] void gate_error(int32_t gate, int64_t layer, int64_t kv_head, int64_t pos) const;
  [[noreturn]] void series_error(int64_t layer, int64_t kv_head, const std::string& why) const;
  void check_head(const char* decision, int64_t layer, int64_t kv_head, int64_t pos) const;
  int held_tier(const char* decision, int64_t layer, int64_t kv_head, int64_t pos) const;
  void check_unlocked(const char* decision, int64_t layer, int64_t kv_head, int64_t pos) const;
  void event(int64_t layer, int64_t kv_head, int64_t pos, trace::EventKind kind, float score,
             uint16_t reason, uint8_t from, uint8_t to);

  cache::RaggedKvCache& cache_;
  int64_t L_, K_;
  PartScope whole_;
  const PartScope* scope_ = &whole_;
  bool storage_locked_ = false;
  int64_t step_ = -1, pos0_ = 0, n_ = 0;
  std::vector<float> row_k_, row_v_;
  std::vector<trace::Event> events_;
  std::vector<trace::GateValue> gates_;
  std::vector<trace::StallRow> stalls_;
  std::vector<trace::MergeRow> merges_;
  std::vector<trace::RerotationRow> rerotations_;
  std::vector<trace::KeyChannelRow> key_channels_;
  const Interventions* iv_ = nullptr;
  int kept_tier_ = -1;
  uint16_t kept_reason_ = 0, drop_reason_ = 0;
  std::vector<uint8_t> dropped_;  // [L * K * max tokens] with drops: 1 once dropped
  std::vector<trace::InterventionRow> interventions_;
  int32_t n_series_ = 0;       // the whole policy's series count
  std::vector<float> series_;  // n_series_ * L * K once a value is recorded this step
};

}  // namespace kvscope::policy
