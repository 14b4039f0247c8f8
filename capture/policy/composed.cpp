#include "capture/policy/composed.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/common/input_error.h"

namespace kvscope::policy {

const char* part_kind_name(PartKind kind) {
  switch (kind) {
    case PartKind::Admission:
      return "admission";
    case PartKind::Selection:
      return "selection";
    case PartKind::Eviction:
      return "eviction";
    case PartKind::Placement:
      return "placement";
  }
  return "?";
}

std::string describe_part(const std::string& name, const Policy& policy) {
  std::string kinds;
  for (PartKind k : policy.kinds())
    kinds += (kinds.empty() ? "" : "+") + std::string(part_kind_name(k));
  const std::string d = policy.describe();
  return "  " + name + " [" + (kinds.empty() ? "no decisions" : kinds) + "]" +
         (d.empty() ? "" : ": " + d) + "\n";
}

namespace {

std::string tier_names(const std::vector<cache::TierSpec>& tiers) {
  std::string out;
  for (const cache::TierSpec& t : tiers) out += (out.empty() ? "" : ", ") + t.name;
  return out;
}

// A part that declares the default (one attended float tier) works on tier 0
// of whatever the composite holds.
bool is_default(const std::vector<cache::TierSpec>& tiers) {
  return tiers.size() == 1 && tiers[0].format == cache::RowFormat::F32 && tiers[0].attended;
}

// Otherwise the part's tiers must be the composite's first tiers (same names and
// formats): parts index tiers by number.
bool tier_prefix(const std::vector<cache::TierSpec>& part,
                 const std::vector<cache::TierSpec>& all) {
  if (is_default(part)) return true;
  if (part.size() > all.size()) return false;
  for (size_t i = 0; i < part.size(); ++i)
    if (part[i].name != all[i].name || part[i].format != all[i].format ||
        part[i].attended != all[i].attended)
      return false;
  return true;
}

}  // namespace

ComposedPolicy::ComposedPolicy(std::string spec, std::vector<Part> parts)
    : spec_(std::move(spec)), parts_(std::move(parts)) {
  for (const Part& p : parts_)
    if (p.policy->plans_capture())
      throw InputError("--policy", spec_,
                       p.name +
                           " runs a context-reconstruction pass after the prefill and "
                           "cannot be composed with other parts");
  for (size_t i = 0; i < parts_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      for (PartKind a : parts_[i].policy->kinds())
        for (PartKind b : parts_[j].policy->kinds())
          if (a == b)
            throw InputError("--policy", spec_,
                             std::string("two ") + part_kind_name(a) + " parts (" + parts_[j].name +
                                 " and " + parts_[i].name +
                                 "): a composite holds at most one part of each kind");
  // Tiers: the longest list; every part's must be its prefix.
  for (const Part& p : parts_) {
    std::vector<cache::TierSpec> t = p.policy->tiers();
    if (t.size() > tiers_.size() || (tiers_.size() == 1 && is_default(tiers_) && !is_default(t)))
      tiers_ = t;
  }
  for (const Part& p : parts_)
    if (!tier_prefix(p.policy->tiers(), tiers_))
      throw InputError("--policy", spec_,
                       p.name + "'s tiers (" + tier_names(p.policy->tiers()) +
                           ") disagree with the composite's (" + tier_names(tiers_) + ")");
  for (const Part& p : parts_)
    for (const std::string& name : p.policy->reads_tiers())
      if (std::none_of(tiers_.begin(), tiers_.end(),
                       [&](const cache::TierSpec& t) { return t.name == name; }))
        throw InputError("--policy", spec_,
                         p.name + " acts on tier '" + name +
                             "', which no part fills (tiers: " + tier_names(tiers_) + ")");
  // Reason 0 is every admission's default: the admission part names it
  // (WG-KV: "local window"), else "new token".
  reasons_ = {"new token"};
  for (const Part& p : parts_)
    for (PartKind k : p.policy->kinds())
      if (k == PartKind::Admission) reasons_[0] = p.policy->reason_names().at(0);
  for (const Part& p : parts_) {
    PartScope s;
    s.name = p.name;
    const std::vector<std::string> r = p.policy->reason_names();
    s.reason_base = uint16_t(reasons_.size());
    s.reasons = uint16_t(r.size());
    for (size_t k = 1; k < r.size(); ++k) reasons_.push_back(p.name + ": " + r[k]);
    const std::vector<trace::GateSpec> g = p.policy->gates();
    s.gate_base = int32_t(gates_.size());
    s.gates = int32_t(g.size());
    gates_.insert(gates_.end(), g.begin(), g.end());
    const std::vector<trace::SeriesSpec> v = p.policy->series();
    s.series_base = int32_t(series_.size());
    s.series = int32_t(v.size());
    series_.insert(series_.end(), v.begin(), v.end());
    scopes_.push_back(s);
  }
}

void ComposedPolicy::setup(const PolicySetup& s) {
  Policy::setup(s);
  for (Part& p : parts_) p.policy->setup(s);
}

cache::StatsNeeds ComposedPolicy::stats_needs() const {
  cache::StatsNeeds all;
  for (const Part& p : parts_) {
    const cache::StatsNeeds n = p.policy->stats_needs();
    all.received |= n.received;
    all.last_query |= n.last_query;
    all.observation_window = std::max(all.observation_window, n.observation_window);
    all.query |= n.query;
    all.hidden |= n.hidden;
    all.key_pre_rope |= n.key_pre_rope;
  }
  return all;
}

const Policy* ComposedPolicy::part_of_kind(PartKind kind) const {
  for (const Part& p : parts_)
    for (PartKind k : p.policy->kinds())
      if (k == kind) return p.policy.get();
  return nullptr;
}

std::string ComposedPolicy::budget_kind() const {
  const Policy* e = part_of_kind(PartKind::Eviction);
  return e ? e->budget_kind() : "none";
}

int64_t ComposedPolicy::budget() const {
  const Policy* e = part_of_kind(PartKind::Eviction);
  return e ? e->budget() : 0;
}

std::vector<PartKind> ComposedPolicy::kinds() const {
  std::vector<PartKind> all;
  for (const Part& p : parts_)
    for (PartKind k : p.policy->kinds()) all.push_back(k);
  return all;
}

// The eviction part's limit counts the attended tiers; another part's tiers
// would count against it, so it holds only when the parts share one tier.
HeldLimit ComposedPolicy::held_limit(const LayerContext& c) const {
  const Policy* e = part_of_kind(PartKind::Eviction);
  return e && tiers_.size() == 1 ? e->held_limit(c) : HeldLimit{};
}

std::string ComposedPolicy::describe() const {
  std::string out;
  for (const Part& p : parts_) out += describe_part(p.name, *p.policy);
  return out;
}

// "part.name" for each part's resolved parameters.
std::vector<std::pair<std::string, double>> ComposedPolicy::resolved_params() const {
  std::vector<std::pair<std::string, double>> all;
  for (const Part& p : parts_)
    for (const auto& [name, value] : p.policy->resolved_params())
      all.emplace_back(p.name + "." + name, value);
  return all;
}

void ComposedPolicy::admit(AdmitContext& c) {
  std::vector<Admission> before;
  for (size_t i = 0; i < parts_.size(); ++i) {
    before = c.decisions;
    c.decide.enter(&scopes_[i]);
    parts_[i].policy->admit(c);
    for (size_t k = 0; k < c.decisions.size(); ++k) {
      Admission& a = c.decisions[k];
      const Admission& b = before[k];
      if (a.tier != b.tier || a.reject != b.reject || a.reason != b.reason)
        a.reason = c.decide.map_reason(a.reason, "admit");
    }
  }
  c.decide.enter(nullptr);
}

void ComposedPolicy::select(SelectContext& c) {
  std::vector<torch::Tensor> mine(c.masks.size());
  for (size_t i = 0; i < parts_.size(); ++i) {
    std::fill(mine.begin(), mine.end(), torch::Tensor());
    SelectContext pc{c.layer, c.step,  c.pos0,   c.n,          c.prefill,
                     c.in,    c.cache, c.decide, c.candidates, mine};
    c.decide.enter(&scopes_[i]);
    parts_[i].policy->select(pc);
    for (size_t h = 0; h < mine.size(); ++h) {
      if (!mine[h].defined()) continue;
      c.masks[h] = c.masks[h].defined() ? c.masks[h].logical_and(mine[h]) : mine[h];
    }
  }
  c.decide.enter(nullptr);
}

void ComposedPolicy::after_attention(LayerContext& c) {
  for (size_t i = 0; i < parts_.size(); ++i) {
    c.decide.enter(&scopes_[i]);
    parts_[i].policy->after_attention(c);
  }
  c.decide.enter(nullptr);
}

void ComposedPolicy::end_step(StepContext& c) {
  for (size_t i = 0; i < parts_.size(); ++i) {
    c.decide.enter(&scopes_[i]);
    parts_[i].policy->end_step(c);
  }
  c.decide.enter(nullptr);
}

}  // namespace kvscope::policy
