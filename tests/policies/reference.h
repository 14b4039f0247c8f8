// Brute-force references written from the papers' definitions, computed from
// a run's recorded queries/keys/values (attention recomputed here, never read
// from the cache).
#pragma once

#include "tests/policies/policy_test_util.h"

namespace kvscope::test::ref {

// SnapKV votes of one kv head: sum over the window queries of the attention
// (mean over the group's heads) on every key; probs [H, n, m].
std::vector<double> snapkv_votes(const torch::Tensor& probs, int64_t kv_head, int64_t R,
                                 int64_t window);
// 1-D pooling over the candidates in position order (avg with zero padding
// counted, or max); returns scores indexed by position.
std::vector<double> pool(const std::vector<int64_t>& sorted_positions,
                         const std::vector<double>& votes, int64_t kernel, bool max_pool,
                         size_t size);
// SnapKV kept set after a one-step prefill of n tokens for one head.
std::set<int64_t> snapkv_kept(const torch::Tensor& probs, int64_t kv_head, int64_t R, int64_t n,
                              int64_t budget, int64_t window, int64_t kernel);
// Expected Attention scores (kvpress's definition, epsilon 0), as natural logs
// (the scores themselves reach 1e-80 on stories260K), of held keys `held`
// (positions) of kv head g, from the pre-RoPE queries q_pre [N, H, d] of
// positions >= sinks, keys [*, K, d] and values [*, K, d] by position.
std::vector<double> expected_attention_scores(const model::Transformer& model,
                                              const torch::Tensor& q_pre, const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const std::vector<int64_t>& held, int64_t kv_head,
                                              int64_t next_pos, int64_t n_future, int64_t sinks,
                                              double scale);
// Pre-RoPE queries of a layer from its input: hidden @ Wq^T (stories260K has
// no q bias or q norm).
torch::Tensor queries_before_rope(const model::Transformer& model, int64_t layer,
                                  const torch::Tensor& hidden);

}  // namespace kvscope::test::ref
