#include "capture/policy/decisions.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "core/common/check.h"

namespace kvscope::policy {

namespace {
constexpr float kNoScoreValue = std::numeric_limits<float>::quiet_NaN();
}

Decisions::Decisions(cache::RaggedKvCache& cache, std::string policy_name, uint16_t reasons,
                     int32_t gates, int32_t series)
    : cache_(cache), L_(cache.n_layers()), K_(cache.n_kv_heads()), n_series_(series) {
  whole_.name = std::move(policy_name);
  whole_.reasons = reasons;
  whole_.gates = gates;
  whole_.series = series;
  row_k_.resize(size_t(cache.head_dim()));
  row_v_.resize(size_t(cache.head_dim()));
}

void Decisions::begin_step(int64_t step, int64_t pos0, int64_t n) {
  step_ = step;
  pos0_ = pos0;
  n_ = n;
  series_.clear();  // values belong to the step they were recorded in
}

void Decisions::fail(const std::string& decision, int64_t layer, int64_t kv_head, int64_t pos,
                     const std::string& why) const {
  throw PolicyError("policy " + scope_->name + ": invalid decision '" + decision + "' at step " +
                    std::to_string(step_) + ", layer " + std::to_string(layer) + ", kv head " +
                    std::to_string(kv_head) + ", position " + std::to_string(pos) + ": " + why);
}

void Decisions::check_head(const char* decision, int64_t layer, int64_t kv_head,
                           int64_t pos) const {
  if (layer < 0 || layer >= L_ || kv_head < 0 || kv_head >= K_)
    fail(decision, layer, kv_head, pos,
         "the model has " + std::to_string(L_) + " layers and " + std::to_string(K_) + " kv heads");
  if (pos < 0 || pos >= tokens_fed())
    fail(decision, layer, kv_head, pos,
         "positions 0.." + std::to_string(tokens_fed() - 1) + " exist so far");
}

int Decisions::held_tier(const char* decision, int64_t layer, int64_t kv_head, int64_t pos) const {
  check_head(decision, layer, kv_head, pos);
  const int tier = cache_.tier_of(layer, kv_head, pos);
  if (tier < 0) fail(decision, layer, kv_head, pos, "the head does not hold this position");
  return tier;
}

void Decisions::check_unlocked(const char* decision, int64_t layer, int64_t kv_head,
                               int64_t pos) const {
  if (storage_locked_)
    fail(decision, layer, kv_head, pos,
         "a selection reads the entries; it does not evict or move them");
}

uint16_t Decisions::map_reason(uint16_t reason, const char* decision) const {
  if (reason >= scope_->reasons)
    throw PolicyError("policy " + scope_->name + ": invalid decision '" + decision + "' at step " +
                      std::to_string(step_) + ": reason " + std::to_string(reason) +
                      " (the policy declares " + std::to_string(scope_->reasons) + " reasons)");
  return reason == 0 ? 0 : uint16_t(scope_->reason_base + reason - 1);
}

void Decisions::event(int64_t layer, int64_t kv_head, int64_t pos, trace::EventKind kind,
                      float score, uint16_t reason, uint8_t from, uint8_t to) {
  events_.push_back(trace::Event{static_cast<int32_t>(step_), static_cast<int16_t>(layer),
                                 static_cast<int16_t>(kv_head), static_cast<int32_t>(pos), kind,
                                 score, reason, from, to});
}

void Decisions::set_interventions(const Interventions* iv, int kept_tier, uint16_t kept_reason,
                                  uint16_t drop_reason) {
  KVSCOPE_CHECK(!iv || (kept_tier < 0 || kept_tier < cache_.n_tiers()),
                "Decisions: the kept tier is no tier of the cache");
  KVSCOPE_CHECK(!iv || !iv->keeps_any() || kept_tier >= 0,
                "Decisions: interventions that keep entries need the kept tier");
  iv_ = iv;
  kept_tier_ = kept_tier;
  kept_reason_ = kept_reason;
  drop_reason_ = drop_reason;
  dropped_.clear();
  if (iv_) dropped_.assign(size_t(L_ * K_ * cache_.max_tokens()), 0);
}

void Decisions::intervention_row(int64_t layer, int64_t kv_head, int64_t pos,
                                 trace::InterventionAction a, trace::EventKind decision,
                                 uint16_t reason, int which, float score) {
  interventions_.push_back(trace::InterventionRow{
      static_cast<int32_t>(step_), static_cast<int16_t>(layer), static_cast<int16_t>(kv_head),
      static_cast<int32_t>(pos), a, decision, reason, static_cast<int16_t>(which), score});
}

bool Decisions::kept_instead(int64_t layer, int64_t kv_head, int64_t pos, int tier,
                             trace::EventKind decision, float score, uint16_t reason) {
  int which = 0;
  if (!iv_ || !iv_->keeps(step_, layer, kv_head, pos, &which)) return false;
  cache_.read_entry(layer, kv_head, pos, row_k_.data(), row_v_.data());
  cache_.remove(layer, kv_head, pos);
  cache_.append(layer, kv_head, kept_tier_, pos, row_k_.data(), row_v_.data());
  // A rejected entry was never admitted: it enters the kept tier.
  if (decision == trace::EventKind::Reject)
    event(layer, kv_head, pos, trace::EventKind::Admit, score, kept_reason_, trace::kNoTier,
          uint8_t(kept_tier_));
  else
    event(layer, kv_head, pos, trace::EventKind::Demote, score, kept_reason_, uint8_t(tier),
          uint8_t(kept_tier_));
  intervention_row(layer, kv_head, pos, trace::InterventionAction::Kept, decision, reason, which,
                   score);
  return true;
}

// Whether an intervention makes the policy's decision about `pos` moot: the
// entry is kept (the policy no longer sees it) or was dropped.
bool Decisions::moot(int64_t layer, int64_t kv_head, int64_t pos) const {
  if (!iv_) return false;
  if (kept_tier_ >= 0 && cache_.tier_of(layer, kv_head, pos) == kept_tier_) return true;
  return pos >= 0 && pos < cache_.max_tokens() && layer >= 0 && layer < L_ && kv_head >= 0 &&
         kv_head < K_ && dropped_[size_t((layer * K_ + kv_head) * cache_.max_tokens() + pos)];
}

void Decisions::drop(int64_t layer, int64_t kv_head, int64_t pos, int which) {
  KVSCOPE_CHECK(iv_ != nullptr, "Decisions::drop without interventions");
  const int tier = cache_.tier_of(layer, kv_head, pos);
  if (tier < 0 || tier == kept_tier_) return;
  cache_.remove(layer, kv_head, pos);
  dropped_[size_t((layer * K_ + kv_head) * cache_.max_tokens() + pos)] = 1;
  event(layer, kv_head, pos, trace::EventKind::Evict, kNoScoreValue, drop_reason_, uint8_t(tier),
        trace::kNoTier);
  intervention_row(layer, kv_head, pos, trace::InterventionAction::Dropped, trace::EventKind::Evict,
                   drop_reason_, which, kNoScoreValue);
}

std::vector<trace::InterventionRow> Decisions::take_interventions() {
  return std::exchange(interventions_, {});
}

void Decisions::evict(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason) {
  check_unlocked("evict", layer, kv_head, pos);
  if (moot(layer, kv_head, pos)) return;
  const int tier = held_tier("evict", layer, kv_head, pos);
  const uint16_t r = map_reason(reason, "evict");
  if (kept_instead(layer, kv_head, pos, tier, trace::EventKind::Evict, score, r)) return;
  cache_.remove(layer, kv_head, pos);
  event(layer, kv_head, pos, trace::EventKind::Evict, score, r, uint8_t(tier), trace::kNoTier);
}

void Decisions::move(int64_t layer, int64_t kv_head, int64_t pos, int to_tier, float score,
                     uint16_t reason) {
  check_unlocked("move", layer, kv_head, pos);
  if (moot(layer, kv_head, pos)) return;
  const int from = held_tier("move", layer, kv_head, pos);
  const int64_t declared = kept_tier_ >= 0 ? kept_tier_ : cache_.n_tiers();
  if (to_tier < 0 || to_tier >= declared)
    fail("move", layer, kv_head, pos,
         "tier " + std::to_string(to_tier) + " does not exist (the policy declares " +
             std::to_string(declared) + ")");
  const uint16_t r = map_reason(reason, "move");
  if (from == to_tier) return;
  if (!cache_.tiers()[size_t(to_tier)].attended &&
      kept_instead(layer, kv_head, pos, from, trace::EventKind::Demote, score, r))
    return;
  cache_.read_entry(layer, kv_head, pos, row_k_.data(), row_v_.data());
  cache_.remove(layer, kv_head, pos);
  cache_.append(layer, kv_head, to_tier, pos, row_k_.data(), row_v_.data());
  // Lower tier index = hotter.
  event(layer, kv_head, pos, to_tier > from ? trace::EventKind::Demote : trace::EventKind::Promote,
        score, r, uint8_t(from), uint8_t(to_tier));
}

void Decisions::select(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason) {
  check_head("select", layer, kv_head, pos);
  const uint16_t r = map_reason(reason, "select");
  const int tier = cache_.tier_of(layer, kv_head, pos);
  const uint8_t t = tier < 0 ? trace::kNoTier : uint8_t(tier);
  event(layer, kv_head, pos, trace::EventKind::Select, score, r, t, t);
}

void Decisions::gate_error(int32_t gate, int64_t layer, int64_t kv_head, int64_t pos) const {
  check_head("gate", layer, kv_head, pos);
  fail("gate", layer, kv_head, pos,
       "gate " + std::to_string(gate) + " (the policy declares " + std::to_string(scope_->gates) +
           " gates)");
}

void Decisions::series(int32_t index, int64_t layer, int64_t kv_head, float value) {
  if (layer < 0 || layer >= L_ || kv_head < 0 || kv_head >= K_)
    series_error(
        layer, kv_head,
        "the model has " + std::to_string(L_) + " layers and " + std::to_string(K_) + " kv heads");
  if (index < 0 || index >= scope_->series)
    series_error(layer, kv_head,
                 "series " + std::to_string(index) + " (the policy declares " +
                     std::to_string(scope_->series) + " series)");
  // Dense per step: one value per (series, head), so a later value replaces.
  if (series_.empty())
    series_.assign(size_t(n_series_ * L_ * K_), std::numeric_limits<float>::quiet_NaN());
  series_[size_t(((scope_->series_base + index) * L_ + layer) * K_ + kv_head)] = value;
}

void Decisions::stall(int64_t layer, int64_t kv_head, int64_t pos, float wait_s) {
  check_head("stall", layer, kv_head, pos);
  if (!std::isfinite(wait_s) || wait_s < 0) {
    char wait[32];
    std::snprintf(wait, sizeof wait, "%g", double(wait_s));
    fail("stall", layer, kv_head, pos,
         "wait " + std::string(wait) + " s (expected a finite time >= 0)");
  }
  stalls_.push_back(trace::StallRow{static_cast<int32_t>(step_), static_cast<int16_t>(layer),
                                    static_cast<int16_t>(kv_head), static_cast<int32_t>(pos),
                                    wait_s, -1});
}

void Decisions::merge(int64_t layer, int64_t kv_head, int64_t pos, int64_t into, float weight,
                      const float* value) {
  check_unlocked("merge", layer, kv_head, pos);
  if (moot(layer, kv_head, pos) || moot(layer, kv_head, into)) return;
  held_tier("merge", layer, kv_head, pos);
  held_tier("merge", layer, kv_head, into);
  if (into == pos) fail("merge", layer, kv_head, pos, "an entry cannot absorb itself");
  if (!std::isfinite(weight) || weight < 0)
    fail("merge", layer, kv_head, pos, "weight " + std::to_string(weight) + " (expected >= 0)");
  cache_.rewrite(layer, kv_head, into, nullptr, value);
  merges_.push_back(trace::MergeRow{static_cast<int32_t>(step_), static_cast<int16_t>(layer),
                                    static_cast<int16_t>(kv_head), static_cast<int32_t>(pos),
                                    static_cast<int32_t>(into), weight});
}

void Decisions::rerotate(int64_t layer, int64_t kv_head, int64_t pos, int64_t position,
                         const float* key) {
  check_unlocked("rerotate", layer, kv_head, pos);
  if (moot(layer, kv_head, pos)) return;
  held_tier("rerotate", layer, kv_head, pos);
  if (position < 0 || position > pos)
    fail("rerotate", layer, kv_head, pos,
         "position " + std::to_string(position) + " (expected 0 .. the token's own position)");
  cache_.rewrite(layer, kv_head, pos, key, nullptr);
  rerotations_.push_back(trace::RerotationRow{
      static_cast<int32_t>(step_), static_cast<int16_t>(layer), static_cast<int16_t>(kv_head),
      static_cast<int32_t>(pos), static_cast<int32_t>(position)});
}

void Decisions::prune_key_channels(int64_t layer, int64_t kv_head,
                                   const std::vector<int32_t>& pruned) {
  check_unlocked("prune_key_channels", layer, kv_head, 0);
  check_head("prune_key_channels", layer, kv_head, 0);
  const int64_t hd = cache_.head_dim();
  std::vector<char> drop(size_t(hd), 0);
  for (size_t i = 0; i < pruned.size(); ++i) {
    if (pruned[i] < 0 || pruned[i] >= hd || (i > 0 && pruned[i] <= pruned[i - 1]))
      fail("prune_key_channels", layer, kv_head, 0,
           "channels must ascend within 0.." + std::to_string(hd - 1));
    drop[size_t(pruned[i])] = 1;
  }
  std::vector<int32_t> kept;
  for (int32_t ch = 0; ch < hd; ++ch)
    if (!drop[size_t(ch)]) kept.push_back(ch);
  try {
    cache_.set_key_channels(layer, kv_head, std::move(kept));
  } catch (const std::logic_error& e) {
    fail("prune_key_channels", layer, kv_head, 0, e.what());
  }
  for (int32_t ch : pruned)
    key_channels_.push_back(
        trace::KeyChannelRow{static_cast<int32_t>(step_), static_cast<int16_t>(layer),
                             static_cast<int16_t>(kv_head), static_cast<int16_t>(ch)});
}

void Decisions::series_error(int64_t layer, int64_t kv_head, const std::string& why) const {
  throw PolicyError("policy " + scope_->name + ": invalid decision 'series' at step " +
                    std::to_string(step_) + ", layer " + std::to_string(layer) + ", kv head " +
                    std::to_string(kv_head) + ": " + why);
}

void Decisions::write(int64_t layer, int64_t kv_head, int64_t pos, int tier, const float* k,
                      const float* v) {
  if (tier < 0 || tier >= cache_.n_tiers())
    fail("admit", layer, kv_head, pos,
         "tier " + std::to_string(tier) + " does not exist (the policy declares " +
             std::to_string(cache_.n_tiers()) + ")");
  cache_.append(layer, kv_head, tier, pos, k, v);
}

void Decisions::admit(int64_t layer, int64_t kv_head, int64_t pos, int tier, float score,
                      uint16_t reason) {
  event(layer, kv_head, pos, trace::EventKind::Admit, score, reason, trace::kNoTier, uint8_t(tier));
}

void Decisions::reject(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason) {
  const uint16_t r = map_reason(reason, "reject");
  if (kept_instead(layer, kv_head, pos, 0, trace::EventKind::Reject, score, r)) return;
  cache_.remove(layer, kv_head, pos);
  event(layer, kv_head, pos, trace::EventKind::Reject, score, r, trace::kNoTier, trace::kNoTier);
}

std::vector<trace::Event> Decisions::take_events() {
  return std::exchange(events_, {});
}
std::vector<trace::GateValue> Decisions::take_gates() {
  return std::exchange(gates_, {});
}
std::vector<float> Decisions::take_series() {
  return std::exchange(series_, {});
}
std::vector<trace::KeyChannelRow> Decisions::take_key_channels() {
  return std::exchange(key_channels_, {});
}

std::vector<trace::RerotationRow> Decisions::take_rerotations() {
  return std::exchange(rerotations_, {});
}

std::vector<trace::MergeRow> Decisions::take_merges() {
  return std::exchange(merges_, {});
}

std::vector<trace::StallRow> Decisions::take_stalls() {
  return std::exchange(stalls_, {});
}

}  // namespace kvscope::policy
