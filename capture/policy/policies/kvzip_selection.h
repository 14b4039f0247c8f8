// KVzip's end of prefill, shared with Fast KVzip (kvzip.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/policy/decisions.h"
#include "capture/policy/params.h"
#include "capture/policy/policy.h"

namespace kvscope::policy {

// Records scores [L][K][T] as gate 0 of every entry and evicts what
// kvzip_evictions (descriptors.h) picks, with reason 1: the L*K*(T - budget)
// lowest over all layers and heads, or K*(T - budget) per layer.
void record_and_evict_lowest(Decisions& decide, const std::vector<float>& scores, int64_t L,
                             int64_t K, int64_t T, int64_t budget, bool layerwise);

// Puts the first `sinks` positions of each of the `groups` rows of T scores
// ([groups][T]) above every score of the buffer (kvpress: the largest score
// + 1), so the selection never picks them. The policy and RestoreKV's
// trainer (restorekv_training.cpp) share it.
void lift_sinks(std::vector<float>& scores, int64_t groups, int64_t T, int64_t sinks);

// KVzip's policy, also behind KVgrad (kvgrad.cpp): the same reconstruction
// pass, scored by gradient attribution instead of attention alone.
struct KvzipOptions {
  std::string name = "kvzip";  // names the policy in messages
  int64_t budget = 256, sinks = 4, chunk = 2048, prefix = 0;
  bool layerwise = false, plus = false, chat = true;
  bool grad = false;  // KVgrad: kvgrad_chunk_scores instead of the attention peak
  // RestoreKV (restorekv.cpp): tokens inserted right after the pass. The
  // eviction waits for the end of their step and keeps `restore` fewer
  // context entries per (layer, kv head) on average (kvpress's budget match:
  // compression_ratio + n / context), the inserted entries never evicted.
  int64_t restore = 0;
};
std::unique_ptr<Policy> make_kvzip_policy(const KvzipOptions& options);
// The parameters both take (budget, sinks, chunk, prefix, layerwise, chat),
// and the options they give.
std::vector<ParamSpec> kvzip_params(const std::string& chunk_default);
KvzipOptions kvzip_options(const Params& p, const std::string& name);

}  // namespace kvscope::policy
