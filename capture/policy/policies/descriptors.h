// One function per built-in policy, each defined in its own file under
// capture/policy/policies/ and listed in builtin.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "capture/policy/registry.h"

namespace kvscope::policy {

PolicyDescriptor full_descriptor();
PolicyDescriptor window_descriptor();
PolicyDescriptor streaming_llm_descriptor();
PolicyDescriptor h2o_descriptor();
PolicyDescriptor tova_descriptor();
PolicyDescriptor snapkv_descriptor();
PolicyDescriptor pyramidkv_descriptor();
PolicyDescriptor knorm_descriptor();
PolicyDescriptor expected_attention_descriptor();
PolicyDescriptor adakv_descriptor();
PolicyDescriptor duo_attention_descriptor();
PolicyDescriptor quest_descriptor();
PolicyDescriptor wgkv_descriptor();
PolicyDescriptor attention_gate_descriptor();
PolicyDescriptor trimkv_descriptor();
PolicyDescriptor dbtrimkv_descriptor();
PolicyDescriptor kvpop_descriptor();
PolicyDescriptor sfc_descriptor();
PolicyDescriptor scripted_descriptor();
// The kvpress catalogue (docs/policies/README.md, "kvpress presses").
PolicyDescriptor random_descriptor();
PolicyDescriptor observed_attention_descriptor();
PolicyDescriptor keydiff_descriptor();
PolicyDescriptor lagkv_descriptor();
PolicyDescriptor cur_descriptor();
PolicyDescriptor leverage_descriptor();
PolicyDescriptor non_causal_attention_descriptor();
PolicyDescriptor compactor_descriptor();
PolicyDescriptor criticalkv_descriptor();
PolicyDescriptor simlayerkv_descriptor();
PolicyDescriptor think_descriptor();
PolicyDescriptor qfilter_descriptor();
PolicyDescriptor critical_adakv_descriptor();
PolicyDescriptor cap_descriptor();
PolicyDescriptor expected_attention_stats_descriptor();
PolicyDescriptor dms_descriptor();
PolicyDescriptor cam_descriptor();
PolicyDescriptor finch_descriptor();
PolicyDescriptor kvzip_descriptor();
// KVzip's selection (kvzip.cpp), for the unit test: scores [L][K][T] with the
// sinks already lifted; the (layer, kv head, position) to evict, lowest first
// (ties: the older position, then the lower layer and head).
std::vector<std::array<int32_t, 3>> kvzip_evictions(const std::vector<float>& scores, int64_t L,
                                                    int64_t K, int64_t T, int64_t budget,
                                                    bool layerwise);
PolicyDescriptor kvcompose_descriptor();
PolicyDescriptor lukv_descriptor();
PolicyDescriptor kvzap_descriptor();
PolicyDescriptor fastkvzip_descriptor();
PolicyDescriptor dms_learned_descriptor();
PolicyDescriptor kvgrad_descriptor();
PolicyDescriptor restorekv_descriptor();
// LU-KV (lukv.cpp), for the unit test: the curve row for a compression ratio
// (round(100 ratio) - 1 in [0, 98], half to even), and the entries each of a
// layer's heads keeps of T from its prune ratios.
int64_t lukv_curve_row(double ratio);
std::vector<int64_t> lukv_head_counts(const std::vector<double>& prune, int64_t T);
// KVCompose's counts (kvcompose.cpp), for the unit test: scores [L][K][T]
// (after the mean across heads); entries each (layer, kv head) keeps, [L*K].
// Ties between slots: the lower layer (head), then the better rank.
std::vector<int64_t> kvcompose_counts(const std::vector<float>& scores, int64_t L, int64_t K,
                                      int64_t T, int64_t budget, bool structured, bool head_max,
                                      int64_t floor);

// Per-head scorers the policies above are built from (capture/policy/scorer.h).
struct ScorerDescriptor;
ScorerDescriptor tova_scorer();
ScorerDescriptor snapkv_scorer();
ScorerDescriptor knorm_scorer();
ScorerDescriptor expected_attention_scorer();
ScorerDescriptor random_scorer();
ScorerDescriptor observed_attention_scorer();
ScorerDescriptor keydiff_scorer();
ScorerDescriptor lagkv_scorer();
ScorerDescriptor cur_scorer();
ScorerDescriptor leverage_scorer();
ScorerDescriptor cap_scorer();
ScorerDescriptor kvzap_scorer();

// PyramidKV's per-layer budgets (mean `budget` per head, window included).
std::vector<int64_t> pyramid_budgets(int64_t layers, int64_t budget, int64_t window, double beta);
// kvpress PyramidKVPress's budgets for a prompt of T tokens: the whole mean
// budget (window included) on the sequence, capped at the prompt, SnapKV's
// uniform budget where the pyramid would not fit.
std::vector<int64_t> pyramid_budgets_kvpress(int64_t layers, int64_t budget, int64_t window,
                                             double beta, int64_t T);

}  // namespace kvscope::policy
