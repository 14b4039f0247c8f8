// KVpop's numeric building blocks (seed 003): static priorities and ranks,
// the running top-k cutoff (Fenwick tree, Algorithm 2), the teacher's boundary
// pairs, the future-attention target by the transposed pass (appendix D), the
// fixed-budget sparse attention (eq. 26, appendix C) and the pieces of the
// boundary loss (eq. 7, 22-24). Equation numbers refer to the paper.
//
// Per KV head the cache keeps s sink tokens, the w most recent tokens
// (q - w < t <= q) and the top-k of the eligible set
//   E(q) = {t : s <= t <= q - w}                                  (eq. 4)
// ranked by r_t + (q - t) log(gamma) (eq. 18 with n = 1), i.e. by the static
// priority pbar_t = r_t - t log(gamma) (eq. 20).
//
// Everything here is flat and explicit; preconditions throw
// std::invalid_argument. The torch functions work on one sequence (no batch
// dimension); q is [H, S, d] with query head h belonging to kv head
// h / (H / K) (consecutive groups, as HF repeat_kv).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace kvscope::gates::kvpop {

// ---- Static priorities and ranks (eq. 19-20) ------------------------------

// pbar_t = raw_t - t * log_gamma (eq. 20). log_gamma <= 0 (gamma in (0, 1],
// so newer tokens get a bonus); NaN raw scores are rejected.
std::vector<float> static_priority(const float* raw, int64_t S, double log_gamma);

// rank[t] in 0..S-1, rank 0 = highest priority. Ties: the later position
// ranks first (recency, as the decay intends; a strict total order keeps the
// top-k exactly k and independent of the sort algorithm). NaN is rejected.
std::vector<int32_t> static_ranks(const float* priority, int64_t S);

// token_of_rank[rank[t]] = t; throws unless rank is a permutation of 0..S-1.
std::vector<int32_t> tokens_by_rank(const int32_t* ranks, int64_t S);

// ---- Fenwick tree over ranks (appendix C.2) -------------------------------

// A multiset of ranks in 0..S-1 with O(log S) insert, erase and k-th
// smallest.
class Fenwick {
 public:
  explicit Fenwick(int64_t S);

  void insert(int32_t rank);
  void erase(int32_t rank);  // rank must be present
  int64_t count() const { return count_; }
  // The k-th smallest inserted rank (k = 1: the smallest), 1 <= k <= count(),
  // by binary lifting: descend the implicit tree, keeping the largest prefix
  // whose count is still < k.
  int32_t find_by_prefix_count(int64_t k) const;

 private:
  int64_t prefix_count(int32_t rank) const;  // inserted ranks <= rank
  void add(int32_t rank, int32_t delta);

  std::vector<int32_t> tree_;  // 1-based; tree_[i] counts ranks (i - lowbit(i), i]
  int64_t count_ = 0;
  int32_t top_bit_ = 0;  // highest power of two <= S
};

// ---- Running top-k cutoffs (Algorithm 2) ----------------------------------

// cutoff[q] when fewer than k tokens are eligible: every eligible token is
// kept (no valid rank reaches it).
inline constexpr int32_t kAllKept = std::numeric_limits<int32_t>::max();
// cutoff[q] when k == 0: no eligible token is kept (every rank is above it).
inline constexpr int32_t kNoneKept = -1;

// An eligible token with this rank is in the top-k at a query with this
// cutoff (eq. 26, rank(t) <= tau_q).
inline bool kept(int32_t rank, int32_t cutoff) {
  return rank <= cutoff;
}

// For q = 0..S-1: insert rank(q - w) once q - w >= s; cutoff[q] = the rank of
// the k-th best token of E(q) if |E(q)| >= k, else kAllKept. O(S log S).
// ranks: a permutation of 0..S-1. s >= 0, w >= 1, k >= 0.
std::vector<int32_t> running_cutoffs(const int32_t* ranks, int64_t S, int64_t s, int64_t w,
                                     int64_t k);
// The same by sorting E(q) at every q, O(S^2 log S): the oracle for tests.
std::vector<int32_t> running_cutoffs_bruteforce(const int32_t* ranks, int64_t S, int64_t s,
                                                int64_t w, int64_t k);

// ---- Boundary pairs of the loss (eq. 5-6, 25, B.6) ------------------------

// One pair per sampled query position q (ascending).
struct BoundaryPairs {
  std::vector<int64_t> q, t_new, t_bnd;
  std::vector<float> y;  // +1: the teacher keeps t_new, -1: it drops it
};

// For each q >= s + w + k (eq. 25: |E(q-1)| >= k, the long-range set is
// saturated): t_new = q - w, t_bnd = the k-th best token of E(q-1) =
// E(q) \ {t_new}, y = +1 if rank(t_new) < rank(t_bnd) else -1.
// t_bnd is the token t_new would displace, our reading of "the last retained
// token": taking it before t_new enters means t_bnd != t_new even when t_new
// itself becomes the k-th best of E(q) (the pair then still compares t_new
// against the token it pushed out).
// teacher_ranks: a permutation of 0..S-1 (static ranks of the target scores).
// max_pairs > 0 keeps at most that many positions: half drawn uniformly, half
// biased to late positions (density growing linearly with q), without
// repetition and deterministic for a seed; max_pairs <= 0 keeps every q.
BoundaryPairs boundary_pairs(const int32_t* teacher_ranks, int64_t S, int64_t s, int64_t w,
                             int64_t k, int64_t max_pairs = 0, uint64_t seed = 0);

// ---- Future-attention target (eq. 2-3, 8, 13-17, appendix D) --------------

struct TargetOptions {
  double scale = 1.0;                // logit scale, usually 1/sqrt(d)
  double eps = 1e-6;                 // eq. 3, 14, 15
  enum Agg { Max, Mean } agg = Max;  // eq. 14 / eq. 15
  bool count_normalise = false;      // eq. 16-17
  int64_t block = 128;               // keys per block of the transposed pass
};

// r_tgt [K, S] float32: log(eps + Agg_g mbar_t^(g)) with
// mbar_t^(g) = sum_{d >= t + w} exp(q_d.k_t * scale - lse[d]) (eq. 13, 30),
// minus log N_t, N_t = max(1, S - (t + w)), when count_normalise (eq. 17).
// Tokens with no future query (t + w > S - 1) have mbar = 0, so log(eps).
// q [H, S, d], k [K, S, d] (RoPE applied), lse [H, S]: the per-query
// log-normaliser, dense (exact, eq. 28) or sparse (eq. 34). Computed by the
// transposed pass (D.2) in blocks of keys: memory O(H * block * S), never
// S x S. No gradient.
torch::Tensor future_attention_target(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& lse, int64_t w, const TargetOptions& o);
// The literal definition through the full [H, S, S] probability matrix
// p_{d->t} = exp(l(d, t) - lse_d) (eq. 29): for tests.
torch::Tensor future_attention_target_dense(const torch::Tensor& q, const torch::Tensor& k,
                                            const torch::Tensor& lse, int64_t w,
                                            const TargetOptions& o);

// ---- Fixed-budget sparse attention (eq. 26, appendix C) -------------------

struct SparseAttention {
  torch::Tensor out;  // [H, S, d], differentiable in q, k, v
  torch::Tensor lse;  // [H, S], the sparse log-normaliser (eq. 9, 34), detached
};

// softmax(q.k * scale) v over the keys of M[q, t] = t <= q and (t < s or
// q - t < w or (s <= t <= q - w and kept(rank[t], cutoff[q]))) (eq. 26).
// ranks, cutoffs: per kv head, [K][S]. Computed by blocks of queries; a
// block's mask is built from ranks and cutoffs (O(block * S)).
SparseAttention sparse_attention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 const std::vector<std::vector<int32_t>>& ranks,
                                 const std::vector<std::vector<int32_t>>& cutoffs, int64_t s,
                                 int64_t w, double scale, int64_t block = 128);
// The whole mask as a bool [K, S, S] tensor, entry by entry: for tests only.
torch::Tensor sparse_mask_dense(const std::vector<std::vector<int32_t>>& ranks,
                                const std::vector<std::vector<int32_t>>& cutoffs, int64_t S,
                                int64_t s, int64_t w);

// ---- Boundary loss (eq. 7, 22-24) -----------------------------------------

// w_min + (1 - w_min) sigmoid(margin / tau_w) (eq. 23); margin = the teacher
// margin of eq. 22. Detached: weights are constants of the loss.
torch::Tensor margin_weights(const torch::Tensor& margin, double w_min, double tau_w);

// Eq. 24: clip(1 / (2 rho_h), c_min, c_max) for y = +1 and
// clip(1 / (2 (1 - rho_h)), c_min, c_max) for y = -1, rho_h = the fraction of
// y = +1 among head h's valid examples, divided by the mean over the valid
// examples. y [N] in {-1, 0, +1}, 0 = invalid (weight 0); head [N] int64 in
// 0..n_heads-1. Detached.
torch::Tensor balance_weights(const torch::Tensor& y, const torch::Tensor& head, int64_t n_heads,
                              double c_min, double c_max);

// mean(weight * softplus(-y (r_new - r_bnd) / tau)) over all N examples
// (eq. 7); weight undefined = 1. Differentiable in r_new and r_bnd. N = 0
// gives a zero that still backpropagates (a step without pairs).
torch::Tensor boundary_loss(const torch::Tensor& r_new, const torch::Tensor& r_bnd,
                            const torch::Tensor& y, const torch::Tensor& weight, double tau);

}  // namespace kvscope::gates::kvpop
