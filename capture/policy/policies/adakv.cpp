// adakv: Ada-KV's adaptive head budgets (Feng et al., "Ada-KV: Optimizing KV
// Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference",
// 2024) around ANY per-head scorer. The layer's budget, `budget` entries per
// head times the kv heads, is shared: the layer keeps its highest-scored
// entries wherever they are, so a head whose scores are concentrated gives
// entries to a head whose scores are spread. A safeguard (the official code's
// floor_alpha, kvpress's alpha_safeguard) first guarantees every head its own
// top floor(alpha * budget) entries. `adakv:scorer=snapkv,window=16,...`
// passes the other parameters to the scorer. docs/policies/adakv.md
#include <algorithm>
#include <cmath>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

PolicyDescriptor adakv_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "snapkv", "per-head scorer: " + scorer_names()},
      {"budget", ParamType::Int, "256", "mean entries per head; the layer holds budget x kv heads"},
      {"alpha", ParamType::Float, "0.2",
       "safeguard: every head keeps its top floor(alpha x budget) entries", 0, 1},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only)"}};
  params = with_scorer_params(std::move(params));
  return {
      "adakv",
      "adaptive head budgets: a per-layer budget shared across heads, around any per-head scorer",
      "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for "
      "Efficient LLM "
      "Inference, 2024",
      "docs/policies/adakv.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        const std::string& name = p.get_string("scorer");
        std::unique_ptr<HeadScorer> scorer = make_named_scorer("adakv", p);
        const Protection pr = scorer->protection();
        if (p.get_int("budget") < pr.sinks + pr.recent + 1)
          throw InputError("--policy", "adakv:budget",
                           "must exceed the scorer's protected entries (" +
                               std::to_string(pr.sinks + pr.recent) + ")");
        if (p.get_float("alpha") < 0 || p.get_float("alpha") > 1)
          throw InputError("--policy", "adakv:alpha", "a number in [0, 1] expected");
        auto policy = std::make_unique<ScoredPolicy>(
            std::move(scorer), std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
            "lowest score in the layer");
        policy->set_scorer_name(name);
        policy->shape().adaptive = true;
        policy->shape().alpha = p.get_float("alpha");
        return policy;
      }};
}

}  // namespace kvscope::policy
