// A policy built from parts (`wgkv:gates=g.safetensors+quest:budget=64`): at
// most one part of each kind (admission, selection, eviction, placement). The
// composite declares the union of its parts' tiers, gates, series, reasons
// and statistics, calls every part's hooks in spec order under the part's
// scope (its reason, gate and series numbers mapped onto the composite's
// tables), and ANDs the parts' selection masks. docs/policies/composition.md
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "capture/policy/decisions.h"
#include "capture/policy/policy.h"

namespace kvscope::policy {

// "  name [kinds]: how it is put together\n" (kvscope policies --explain).
std::string describe_part(const std::string& name, const Policy& policy);

class ComposedPolicy : public Policy {
 public:
  struct Part {
    std::string name;
    std::unique_ptr<Policy> policy;
  };
  // Throws InputError for contradictory compositions (two parts of one kind,
  // tier lists that disagree).
  ComposedPolicy(std::string spec, std::vector<Part> parts);

  void setup(const PolicySetup& s) override;
  std::vector<cache::TierSpec> tiers() const override { return tiers_; }
  std::vector<std::string> reason_names() const override { return reasons_; }
  std::vector<trace::GateSpec> gates() const override { return gates_; }
  std::vector<trace::SeriesSpec> series() const override { return series_; }
  cache::StatsNeeds stats_needs() const override;
  std::string budget_kind() const override;
  int64_t budget() const override;
  std::vector<PartKind> kinds() const override;
  HeldLimit held_limit(const LayerContext& c) const override;
  std::string describe() const override;

  void admit(AdmitContext& c) override;
  void select(SelectContext& c) override;
  void after_attention(LayerContext& c) override;
  void end_step(StepContext& c) override;

  std::vector<std::pair<std::string, double>> resolved_params() const override;

 private:
  const Policy* part_of_kind(PartKind kind) const;

  std::string spec_;
  std::vector<Part> parts_;
  std::vector<PartScope> scopes_;
  std::vector<cache::TierSpec> tiers_;
  std::vector<std::string> reasons_;
  std::vector<trace::GateSpec> gates_;
  std::vector<trace::SeriesSpec> series_;
};

}  // namespace kvscope::policy
