// kvgrad: KVgrad (kvpress KVgradPress; openreview cg1wTCJjjk). KVzip's
// context reconstruction, scored by input x gradient attribution instead of
// attention alone: the model repeats each chunk of its context over the
// prefilled cache a second time, with autograd, and an entry c of layer l
// scores
//   S(l, c) = max over replay tokens p and the group's query heads g of
//             A_lgp(c) * ||v_c W_O^g|| * ||d Phi / d a_lp||
// where A is KVzip's chunked attention weight, a_lp what layer l's attention
// adds to the residual stream at p, and Phi = sum_p ||x_p||^2 over the
// residual stream after the last layer. Selection as KVzip's (sinks above all,
// the lowest over all layers and heads evicted). The pass is KVzip's
// (CapturePlan::reconstruction: the trace records it); the attribution replays
// each chunk once more through the model with autograd at its first layer
// (kvgrad_attribution.cpp). docs/policies/kvgrad.md
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/kvzip_selection.h"

namespace kvscope::policy {

PolicyDescriptor kvgrad_descriptor() {
  return {"kvgrad",
          "score each context entry by attention x ||v W_O|| x the gradient of the last "
          "residual stream's energy while the model repeats the context (KVzip's pass, "
          "replayed with autograd); evict the lowest over all heads",
          "KVgrad (openreview cg1wTCJjjk; kvpress KVgradPress)",
          "docs/policies/kvgrad.md",
          kvzip_params("512"),  // kvpress KVgradPress's chunk_size
          [](const Params& p) -> std::unique_ptr<Policy> {
            KvzipOptions o = kvzip_options(p, "kvgrad");
            o.grad = true;
            return make_kvzip_policy(o);
          }};
}

}  // namespace kvscope::policy
