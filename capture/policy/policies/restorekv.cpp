// restorekv: RestoreKV (Baek et al., "RestoreKV: Recovering Full-Cache
// Behavior Under Aggressive Query-Agnostic KV Cache Eviction", arXiv
// 2608.01247; kvpress RestoreKVPress). KVzip's scoring, then a learned
// restoration under the same budget: after KVzip's reconstruction pass, n
// restore tokens (learned embeddings) are fed once through the model with
// its LoRA adapters on, over the full cache, at the positions right after
// the context; their entries stay, and KVzip evicts n more context entries
// per (layer, kv head) on average (kvpress: compression_ratio + n / context),
// so the cache holds what KVzip alone would. The adapters are off for every
// other token. Inside KVScope the restore tokens are sequence tokens (ids
// V .. V+n-1 of the adapted model's embedding table, "<restore i>" in the
// trace); the tokens after them move on by n positions, as kvpress's question
// does. The adapters and embeddings come from `kvscope train --policy
// restorekv` (self-distillation from the full-cache model; restorekv_training.cpp).
// docs/policies/restorekv.md
#include <memory>

#include "capture/gates/gate_set.h"
#include "capture/gates/restorekv_model.h"
#include "capture/model/transformer.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/kvzip_selection.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

// KVzip with the restore pass: every hook goes to the KVzip part, which
// defers its eviction to the end of the restore tokens' step.
class RestoreKvPolicy : public Policy {
 public:
  RestoreKvPolicy(KvzipOptions o, std::string path)
      : options_(std::move(o)), path_(std::move(path)), kvzip_(make_kvzip_policy(options_)) {}

  bool plans_capture() const override { return true; }
  // The restore tokens follow KVzip's pass, where it runs.
  CapturePlan plan(const PlanInputs& in) override {
    const int64_t n = load_restore_tokens(in.model);
    CapturePlan p = kvzip_->plan(in);
    for (int64_t i = 0; i < n; ++i) p.inserted.names.push_back("<restore " + std::to_string(i) + ">");
    p.inserted.model = [this] { return adapted_.get(); };
    return p;
  }

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    kvzip_->setup(s);
    if (gates_.params.empty() || !s.weights) return;  // no restore pass (a unit test's KVzip)
    torch::NoGradGuard no_grad;
    adapted_ = std::make_unique<model::Transformer>(gates::restorekv_config(*s.model, gates_),
                                                    gates::restorekv_weights(*s.weights, gates_));
  }

  std::vector<std::string> reason_names() const override { return kvzip_->reason_names(); }
  std::vector<trace::GateSpec> gates() const override { return kvzip_->gates(); }
  cache::StatsNeeds stats_needs() const override { return kvzip_->stats_needs(); }
  std::string budget_kind() const override { return kvzip_->budget_kind(); }
  int64_t budget() const override { return kvzip_->budget(); }
  std::vector<PartKind> kinds() const override { return kvzip_->kinds(); }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    auto p = kvzip_->resolved_params();
    if (!gates_.params.empty())
      p.push_back({"tokens", double(gates_.param("restore_embeddings").size(0))});
    return p;
  }
  std::string describe() const override {
    return "KVzip (" + kvzip_->describe() +
           ") with a restore pass: learned restore tokens fed once through the LoRA-adapted "
           "model over the full cache before the eviction, their entries counted in the budget";
  }
  void after_attention(LayerContext& c) override { kvzip_->after_attention(c); }
  void end_step(StepContext& c) override { kvzip_->end_step(c); }

 private:
  // Loads the gate file and remakes the KVzip part with the restore tokens'
  // count; returns the count.
  int64_t load_restore_tokens(const model::ModelConfig& c) {
    gates::check_restorekv_model(c, "restorekv");
    gates_ = gates::load_gates(path_, c);
    if (gates_.kind != gates::GateKind::RestoreKv)
      throw InputError(path_, "policy",
                       std::string("restorekv needs restore tokens and LoRA adapters (kind "
                                   "restorekv); this file holds ") +
                           gates::gate_kind_name(gates_.kind) + " gates");
    const int64_t n = gates_.param("restore_embeddings").size(0);
    if (options_.budget <= n + options_.sinks)
      throw InputError(
          "--policy", "restorekv:budget",
          "'" + std::to_string(options_.budget) + "' leaves no room for the context: the " +
              std::to_string(n) + " restore tokens and " + std::to_string(options_.sinks) +
              " sinks come out of it (expected > " + std::to_string(n + options_.sinks) + ")");
    KvzipOptions o = options_;
    o.restore = n;
    kvzip_ = make_kvzip_policy(o);
    return n;
  }

  KvzipOptions options_;
  std::string path_;
  // Set by plan(): the gate file and the KVzip part that knows n.
  gates::GateSet gates_;
  std::unique_ptr<Policy> kvzip_;
  std::unique_ptr<model::Transformer> adapted_;  // the restore pass's model
};

}  // namespace

PolicyDescriptor restorekv_descriptor() {
  std::vector<ParamSpec> params = kvzip_params("2048");
  params.insert(params.begin(),
                {"gates", ParamType::String, "",
                 "restore tokens and LoRA adapters (kvscope train --policy restorekv); default: "
                 "the shipped ones of the model"});
  PolicyDescriptor d = {
      "restorekv",
      "KVzip plus learned restoration: restore tokens read the full cache once through "
      "LoRA adapters before the eviction and keep their entries in the same budget",
      "Baek et al., RestoreKV: Recovering Full-Cache Behavior Under Aggressive Query-Agnostic "
      "KV Cache Eviction, arXiv 2608.01247 (kvpress RestoreKVPress)",
      "docs/policies/restorekv.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("gates").empty())
          throw InputError("--policy", "restorekv:gates",
                           "a restore file is required (kvscope train --policy restorekv)");
        return std::make_unique<RestoreKvPolicy>(kvzip_options(p, "restorekv"),
                                                 p.get_string("gates"));
      }};
  d.gate_kinds = {"restorekv"};
  return d;
}

}  // namespace kvscope::policy
