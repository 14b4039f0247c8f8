// KVpop's training pass (seed 003 Algorithm 1), behind the model's
// AttentionBackend seam: one forward step over a whole training window.
// Per layer:
//   scores   r^ = Scorer(K, V) on detached inputs (§3.3)
//   mask     static priorities r^ - t log gamma -> ranks -> running top-k
//            cutoffs (Fenwick, appendix C) -> fixed-budget sparse attention
//            (eq. 26), which also returns the sparse log-normalisers
//   target   the future-attention target by the transposed pass from those
//            normalisers (or dense ones: exact), never an S x S matrix
//            (eq. 3, §3.2, appendix D)
//   teacher  the same running top-k over the target's priorities: per sampled
//            query q, the newly eligible t_new = q - w against the token it
//            would displace t_bnd, label y (eq. 5-6)
//   loss     boundary-aware logistic loss on the student's effective scores
//            (eq. 7) with margin (eq. 23) and keep/drop balance (eq. 24) weights
// The attention output is the sparse one, so the model downstream sees what
// inference will (and the full retrofit's KL trains the base through it).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/gates/kvpop_math.h"
#include "capture/gates/kvpop_scorer.h"
#include "capture/model/attention_backend.h"

namespace kvscope::gates {

struct KvpopLossOptions {
  bool dense_lse = false;  // exact target (dense normalisers); default: the paper's sparse ones
  // eps, aggregation (max), count normalisation: on, as eq. 2 defines the
  // target (the mean over the N_t future queries); App. B.2 calls it optional
  // and, without it, early tokens win by having more future queries.
  kvpop::TargetOptions target = [] {
    kvpop::TargetOptions t;
    t.count_normalise = true;
    return t;
  }();
  double tau = 1.0;              // eq. 7 temperature (Table 3: 1.0)
  bool margin_weighting = true;  // eq. 23 (Table 3: on)
  double w_min = 0.1, tau_w = 1.0;
  bool balance = true;  // eq. 24
  double c_min = 0.5, c_max = 5.0;
  int64_t max_pairs = 0;  // sampled query positions per head and layer (0: all, B.6)
  uint64_t seed = 0;
};

class KvpopTrainBackend : public model::AttentionBackend {
 public:
  KvpopTrainBackend(const GateSet& gates, const KvpopLossOptions& o)
      : g_(gates), cfg_(kvpop_config(gates)), o_(o) {}

  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;

  // Per layer, from the last step:
  std::vector<torch::Tensor> loss;  // boundary loss (scalar, autograd to the scorer)
  std::vector<double> agreement;    // share of boundary pairs the student decides as the teacher
  std::vector<double> recall;  // |student top-k ∩ teacher top-k| / k at the last query, head mean
  std::vector<std::vector<double>> recall_heads;  // the same per head [layer][kv head]
  std::vector<int64_t> pairs;                     // boundary pairs

  torch::Tensor mean_loss() const;  // L_score = mean over layers (Algorithm 1, line 12)

 private:
  torch::Tensor raw_scores(const torch::Tensor& x, int64_t layer) const;
  const GateSet& g_;
  KvpopConfig cfg_;  // the file's budget and scorer kind, read once
  KvpopLossOptions o_;
};

// StreamingLLM+ (seed 003 §4): the fixed pattern `streaming_llm:sinks=s,window=W`
// attends at a decode step, query q seeing t < s and q - W <= t <= q (the
// cache holds s + W entries, the new token joins before the oldest leaves),
// as one differentiable pass over a training window. No scorer and no loss
// of its own: the KL to the dense teacher trains the base through it.
class StreamingTrainBackend : public model::AttentionBackend {
 public:
  StreamingTrainBackend(int64_t sinks, int64_t window) : sinks_(sinks), window_(window) {}

  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;

 private:
  int64_t sinks_, window_;
};

// The per-query dense log-normaliser (eq. 28) by blocks of queries. q [H, S, d],
// k [K, S, d] -> [H, S].
torch::Tensor dense_causal_lse(const torch::Tensor& q, const torch::Tensor& k, double scale,
                               int64_t block = 128);

}  // namespace kvscope::gates
