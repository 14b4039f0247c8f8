// KVgrad's attribution of one reconstruction chunk (kvgrad.cpp): the replay
// of the chunk through the model again, with autograd, over the context the
// cache holds. docs/policies/kvgrad.md
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "capture/cache/ragged_cache.h"
#include "capture/model/model_config.h"
#include "capture/model/model_weights.h"

namespace kvscope::policy {

struct KvgradChunk {
  std::vector<int32_t> ids;    // the repeat prompt and the chunk's text
  int64_t pos0 = 0;            // the replay's first position (right after the prompt)
  int64_t sinks = 0;           // the first `sinks` positions join the chunk in A's softmax
  int64_t start = 0, end = 0;  // the context positions the chunk reconstructs
};

// For every layer l, kv head h and p in [start, end):
//   scores[(l K + h) T + p] = max over the group's query heads g and replay
//     tokens i of A_lgi(p) ||v_p W_O^g|| ||d Phi / d a_li||
// with A the softmax of query i over the sinks, the chunk and the replay's
// own tokens (KVzip's chunked scoring), a_li what layer l's attention adds to
// the residual stream at token i, and Phi = sum_i ||x_i||^2 over the residual
// stream after the last layer (kvpress KVgradPress). The replay attends, as
// the model does, to everything the cache holds plus its own tokens; the
// cache is only read. wo: per layer W_O as [H, hd, D].
void kvgrad_chunk_scores(const model::ModelConfig& config, const model::ModelWeights& weights,
                         const cache::RaggedKvCache& cache, const KvgradChunk& chunk,
                         const std::vector<torch::Tensor>& wo, int64_t T, float* scores);

}  // namespace kvscope::policy
