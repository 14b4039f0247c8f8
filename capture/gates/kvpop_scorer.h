// KVpop's learned importance scorers (Hauzenberger et al., "KVpop: Key-Value
// Cache Compression with Predictive Online Pruning", seed 003 §3.3 and
// appendix E), one per (layer, kv head), over the cached key and value
// x_t = [k_t; v_t] (eq. 35). Shared by the policy (inference, no grad) and
// the trainer (autograd through the parameters; the inputs are detached, §3.3).
// Notation: n tokens, K kv heads, hd head dim, P = proj, F = 2P features.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "capture/gates/gate_set.h"

namespace kvscope::gates {

// The budget and decay a KVpop gate file was trained for (its hyperparameters).
struct KvpopConfig {
  bool mlstm = false;
  bool delayed = true;  // mLSTM readout at the window exit (E.4), else at insertion
  int64_t sinks = 4, window = 64, topk = 188;
  double gamma_min = 0.999, gamma_max = 0.999999;
  int64_t decay_step = 1;
};
KvpopConfig kvpop_config(const GateSet& g);  // throws InputError for a non-KVpop file

// log gamma_h = log gamma_min + sigmoid(alpha_h) (log gamma_max - log gamma_min)  (eq. 21). [K]
torch::Tensor kvpop_log_gamma(const GateSet& g, int64_t layer);

// [k; v] per kv head: k, v [n, K, hd] -> x [K, n, 2 hd].
torch::Tensor kvpop_inputs(const torch::Tensor& k, const torch::Tensor& v);

// Stateless scorer (E.2): r = w2_h . SiLU(W1_h x + b1_h) + b2_h. x [K, n, 2hd] -> r [K, n].
torch::Tensor kvpop_mlp_scores(const GateSet& g, int64_t layer, const torch::Tensor& x);

// The mLSTM's per-token quantities (eq. 37, 40): Hedgehog features
// phi(u) = [softmax(u); softmax(-u)] of the query and key projections, the
// value projection, and the log input gate (exponential gate: log i = pre-
// activation) and log forget gate (log sigmoid).
struct MlstmTokens {
  torch::Tensor q, k;          // [K, n, F]
  torch::Tensor v;             // [K, n, P]
  torch::Tensor log_i, log_f;  // [K, n]
};
MlstmTokens mlstm_tokens(const GateSet& g, int64_t layer, const torch::Tensor& x);

// The score projection of a readout h (eq. 42, no normalisation): a . SiLU(h) + b.
// h [K, ..., P] -> [K, ...].
torch::Tensor mlstm_score_of(const GateSet& g, int64_t layer, const torch::Tensor& h);

// Parallel form over a whole sequence (training, prefill checks): token u is
// read out at position p(u) = min(u + delay, n - 1) from the state C_p, z_p
// (eq. 41: h = q_u^T C_p / q_u^T z_p, the stabiliser cancels in the ratio):
//   C_p = sum_{j<=p} exp(F_p - F_j + log i_j) k_j v_j^T,  F = cumsum(log f).
// delay = window for the delayed readout, 0 for the immediate one. -> r [K, n].
torch::Tensor mlstm_scores_parallel(const GateSet& g, int64_t layer, const torch::Tensor& x,
                                    int64_t delay);

// Recurrent form (inference): the stabilised state of one (layer, head set)
// (eq. 38-39 with m_t = max(log f_t + m_{t-1}, log i_t); C and z are kept
// scaled by exp(-m), which the readout's ratio cancels).
struct MlstmState {
  torch::Tensor C;  // [K, F, P]
  torch::Tensor z;  // [K, F]
  torch::Tensor m;  // [K], -inf before the first token
};
MlstmState mlstm_initial_state(int64_t K, int64_t F, int64_t P);
// Writes token t (all heads): tok holds n = 1 token.
void mlstm_write(MlstmState& s, const MlstmTokens& tok, int64_t i);
// h = q^T C / q^T z for query features q [K, F] -> [K, P].
torch::Tensor mlstm_read(const MlstmState& s, const torch::Tensor& q);
// mlstm_score_of(mlstm_read(s, q)) for raw query features q [K, F] -> scores [K].
void mlstm_read_scores(const GateSet& g, int64_t layer, const MlstmState& s, const float* q,
                       float* scores);

}  // namespace kvscope::gates
