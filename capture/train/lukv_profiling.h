// LU-KV's offline profile (Tang et al., "Predicting Future Utility: Global
// Combinatorial Optimization for Task-Agnostic KV Cache Eviction", 2026,
// arXiv 2602.08585; docs/policies/lukv.md "Making a curve"): the budget curve
// `lukv` reads, made from a model, a scorer and a text.
//
// Per sample (a window of T context tokens followed by C tokens of the same
// text, the "future"):
//   1. the scorer rates the T context entries of every (layer l, kv head h)
//      at the end of the context's prefill, as the `lukv` policy would;
//   2. the future's C queries, fed with the whole cache (full attention,
//      teacher-forced on the text), give every context entry j its oracle
//      importance, the largest contribution it makes to any future step:
//        I(l, h, j) = max_{g in h's query heads} max_{i < C} p_lgi(j) ||v_j W_O^g||;
//   3. head (l, h) keeps its entries in the scorer's order (LU-KV's sinks and
//      window first, then the scorer's own protected entries, then by score):
//      keeping b entries is worth U_lh(b), the sum of the first b importances.
//      U is not concave (the scorer is no oracle), so each head's curve is
//      replaced by its least concave majorant (the convex-hull relaxation): its
//      slopes are the non-increasing regression of the marginals (pool
//      adjacent violators); protected entries have slope +inf;
//   4. for each global ratio rho in 1 %..99 %, the B = round((1 - rho) L K T)
//      kept entries go greedily to the largest slopes over all heads (optimal
//      for the relaxed problem: the slopes fall within each head), and head
//      (l, h) prunes r_lh(rho) = 1 - b_lh / T.
// The curve is the mean of r over the samples: a [99, L, K] float32 .npy.
#pragma once

#include <cstdint>
#include <vector>

#include "capture/train/train_options.h"

namespace kvscope::gates {

// The slopes of the least concave majorant of the cumulative sums of
// `marginal`: its non-increasing least-squares fit (pool adjacent violators,
// unit weights). Same length; sum preserved.
std::vector<double> concave_hull_slopes(const std::vector<double>& marginal);

// One sample's prune ratios for global ratios 1 %..99 %: [99][heads], from
// each head's `forced` entries (kept first, slope +inf) and the hull slopes
// of the rest (concave_hull_slopes, non-increasing); every head holds
// `tokens` entries (forced + slopes). Ties go to the lower head, then the
// older entry. A ratio whose budget is below the forced entries keeps those.
std::vector<std::vector<double>> lukv_sample_prune_ratios(
    const std::vector<int64_t>& forced, const std::vector<std::vector<double>>& slopes,
    int64_t tokens);

// `kvscope train --policy lukv`: the curve to o.output (.npy) and its
// metadata beside it (.json). o.seq_len is T, o.steps the samples; --gate
// takes the `lukv` policy's scorer and its parameters, keep_first, keep_last
// and future (C, default 64).
TrainResult profile_lukv(const TrainOptions& o);

}  // namespace kvscope::gates
