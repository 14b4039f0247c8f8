#include "capture/gates/kvpop_math.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace kvscope::gates::kvpop {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("kvpop: " + what);
}

// Ranks are int32 and kAllKept must stay above every valid rank.
void check_length(int64_t S) {
  require(S >= 0, "sequence length S must be >= 0, got " + std::to_string(S));
  require(S < std::numeric_limits<int32_t>::max(),
          "sequence length S must fit int32 ranks, got " + std::to_string(S));
}

// w >= 1 keeps the query itself in its own window, so no attention row is
// empty and t_new = q - w is always a past token.
void check_budget(int64_t S, int64_t s, int64_t w, int64_t k) {
  check_length(S);
  require(s >= 0, "sink count s must be >= 0, got " + std::to_string(s));
  require(w >= 1, "window w must be >= 1, got " + std::to_string(w));
  require(k >= 0, "long-range budget k must be >= 0, got " + std::to_string(k));
}

void require_nonnull(const void* p, int64_t S, const char* name) {
  require(p != nullptr || S == 0, std::string(name) + " is null with S > 0");
}

}  // namespace

// ---- Static priorities and ranks ------------------------------------------

std::vector<float> static_priority(const float* raw, int64_t S, double log_gamma) {
  check_length(S);
  require_nonnull(raw, S, "raw");
  require(std::isfinite(log_gamma) && log_gamma <= 0,
          "log_gamma must be finite and <= 0 (gamma in (0, 1]), got " + std::to_string(log_gamma));
  std::vector<float> p(S);
  for (int64_t t = 0; t < S; ++t) {
    require(!std::isnan(raw[t]), "raw score of token " + std::to_string(t) + " is NaN");
    // Eq. 20: the age bonus -t log(gamma) grows with t; double keeps t * log_gamma exact enough
    // for long sequences before rounding once.
    p[t] = static_cast<float>(static_cast<double>(raw[t]) - static_cast<double>(t) * log_gamma);
  }
  return p;
}

std::vector<int32_t> static_ranks(const float* priority, int64_t S) {
  check_length(S);
  require_nonnull(priority, S, "priority");
  for (int64_t t = 0; t < S; ++t)
    require(!std::isnan(priority[t]), "priority of token " + std::to_string(t) + " is NaN");
  std::vector<int32_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  // Higher priority first; on a tie the later token first (a strict total order).
  std::sort(order.begin(), order.end(), [priority](int32_t a, int32_t b) {
    if (priority[a] != priority[b]) return priority[a] > priority[b];
    return a > b;
  });
  std::vector<int32_t> rank(S);
  for (int64_t r = 0; r < S; ++r) rank[order[r]] = static_cast<int32_t>(r);
  return rank;
}

std::vector<int32_t> tokens_by_rank(const int32_t* ranks, int64_t S) {
  check_length(S);
  require_nonnull(ranks, S, "ranks");
  std::vector<int32_t> token(S, -1);
  for (int64_t t = 0; t < S; ++t) {
    const int32_t r = ranks[t];
    require(r >= 0 && r < S && token[r] < 0, "ranks must be a permutation of 0..S-1; token " +
                                                 std::to_string(t) + " has rank " +
                                                 std::to_string(r));
    token[r] = static_cast<int32_t>(t);
  }
  return token;
}

// ---- Fenwick tree ---------------------------------------------------------

Fenwick::Fenwick(int64_t S) {
  check_length(S);
  tree_.assign(static_cast<size_t>(S) + 1, 0);
  if (S >= 1) top_bit_ = 1;
  while (top_bit_ > 0 && int64_t{top_bit_} * 2 <= S) top_bit_ *= 2;
}

void Fenwick::add(int32_t rank, int32_t delta) {
  const int64_t n = static_cast<int64_t>(tree_.size()) - 1;
  for (int64_t i = int64_t{rank} + 1; i <= n; i += i & -i) tree_[i] += delta;
  count_ += delta;
}

int64_t Fenwick::prefix_count(int32_t rank) const {
  int64_t c = 0;
  for (int64_t i = int64_t{rank} + 1; i > 0; i -= i & -i) c += tree_[i];
  return c;
}

void Fenwick::insert(int32_t rank) {
  require(rank >= 0 && rank < static_cast<int64_t>(tree_.size()) - 1,
          "Fenwick::insert: rank " + std::to_string(rank) + " outside 0..S-1");
  add(rank, +1);
}

void Fenwick::erase(int32_t rank) {
  require(rank >= 0 && rank < static_cast<int64_t>(tree_.size()) - 1,
          "Fenwick::erase: rank " + std::to_string(rank) + " outside 0..S-1");
  const int64_t here = prefix_count(rank) - (rank > 0 ? prefix_count(rank - 1) : 0);
  require(here > 0, "Fenwick::erase: rank " + std::to_string(rank) + " is not in the tree");
  add(rank, -1);
}

int32_t Fenwick::find_by_prefix_count(int64_t k) const {
  require(k >= 1 && k <= count_, "Fenwick::find_by_prefix_count: k = " + std::to_string(k) +
                                     " outside 1.." + std::to_string(count_));
  const int64_t n = static_cast<int64_t>(tree_.size()) - 1;
  // Invariant: prefix count of 1-based index pos < k, with `remaining` = k minus it. The answer is
  // 1-based index pos + 1, i.e. 0-based rank pos.
  int64_t pos = 0;
  int64_t remaining = k;
  for (int64_t step = top_bit_; step > 0; step >>= 1) {
    const int64_t next = pos + step;
    if (next <= n && tree_[next] < remaining) {
      pos = next;
      remaining -= tree_[next];
    }
  }
  return static_cast<int32_t>(pos);
}

// ---- Running top-k cutoffs ------------------------------------------------

std::vector<int32_t> running_cutoffs(const int32_t* ranks, int64_t S, int64_t s, int64_t w,
                                     int64_t k) {
  check_budget(S, s, w, k);
  tokens_by_rank(ranks, S);  // validates the permutation
  Fenwick tree(S);
  std::vector<int32_t> cutoff(S);
  for (int64_t q = 0; q < S; ++q) {
    // Algorithm 2: exactly one token, q - w, enters E(q) per query; the tree holds E(q).
    if (q - w >= s) tree.insert(ranks[q - w]);
    if (tree.count() < k)
      cutoff[q] = kAllKept;
    else
      cutoff[q] = k == 0 ? kNoneKept : tree.find_by_prefix_count(k);
  }
  return cutoff;
}

std::vector<int32_t> running_cutoffs_bruteforce(const int32_t* ranks, int64_t S, int64_t s,
                                                int64_t w, int64_t k) {
  check_budget(S, s, w, k);
  tokens_by_rank(ranks, S);
  std::vector<int32_t> cutoff(S);
  for (int64_t q = 0; q < S; ++q) {
    std::vector<int32_t> eligible;
    for (int64_t t = s; t <= q - w; ++t) eligible.push_back(ranks[t]);
    std::sort(eligible.begin(), eligible.end());
    if (static_cast<int64_t>(eligible.size()) < k)
      cutoff[q] = kAllKept;
    else
      cutoff[q] = k == 0 ? kNoneKept : eligible[k - 1];
  }
  return cutoff;
}

// ---- Boundary pairs -------------------------------------------------------

namespace {

// Uniform double in [0, 1) from 53 random bits: std::uniform_real_distribution is not
// specified bit for bit, and the sample must be the same on every standard library.
double unit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// m distinct indices of 0..n-1, ascending: even draws uniform, odd draws with density 2x on
// [0, 1) (sqrt of a uniform) so late positions, where cache pressure is strongest, are
// favoured (B.6). A taken index moves to the nearest free earlier one (wrapping), so the loop
// ends after m draws.
std::vector<int64_t> sample_indices(int64_t n, int64_t m, uint64_t seed) {
  std::vector<int64_t> out;
  if (m <= 0 || m >= n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  std::mt19937_64 rng(seed);
  std::vector<char> taken(n, 0);
  for (int64_t i = 0; i < m; ++i) {
    const double u = unit(rng);
    const double x = i % 2 == 0 ? u : std::sqrt(u);
    int64_t j = std::min(n - 1, static_cast<int64_t>(x * static_cast<double>(n)));
    while (taken[j]) j = j == 0 ? n - 1 : j - 1;
    taken[j] = 1;
  }
  for (int64_t j = 0; j < n; ++j)
    if (taken[j]) out.push_back(j);
  return out;
}

}  // namespace

BoundaryPairs boundary_pairs(const int32_t* teacher_ranks, int64_t S, int64_t s, int64_t w,
                             int64_t k, int64_t max_pairs, uint64_t seed) {
  check_budget(S, s, w, k);
  require(k >= 1, "boundary pairs need k >= 1 (a boundary token), got k = 0");
  const std::vector<int32_t> token = tokens_by_rank(teacher_ranks, S);
  BoundaryPairs all;
  Fenwick tree(S);
  for (int64_t q = 0; q < S; ++q) {
    const int64_t t_new = q - w;
    if (t_new < s) continue;
    // Eq. 25: from here on |E(q-1)| = q - w - s >= k. The tree still holds E(q-1), so its k-th
    // best is the token t_new would displace.
    if (q >= s + w + k) {
      const int32_t bnd_rank = tree.find_by_prefix_count(k);
      all.q.push_back(q);
      all.t_new.push_back(t_new);
      all.t_bnd.push_back(token[bnd_rank]);
      all.y.push_back(teacher_ranks[t_new] < bnd_rank ? 1.0f : -1.0f);  // eq. 6
    }
    tree.insert(teacher_ranks[t_new]);
  }
  const int64_t n = static_cast<int64_t>(all.q.size());
  if (max_pairs <= 0 || max_pairs >= n) return all;
  BoundaryPairs some;
  for (int64_t i : sample_indices(n, max_pairs, seed)) {
    some.q.push_back(all.q[i]);
    some.t_new.push_back(all.t_new[i]);
    some.t_bnd.push_back(all.t_bnd[i]);
    some.y.push_back(all.y[i]);
  }
  return some;
}

// ---- Future-attention target ----------------------------------------------

namespace {

struct Shape {
  int64_t H, K, G, S, d;
};

Shape check_qk(const torch::Tensor& q, const torch::Tensor& k) {
  require(q.defined() && k.defined(), "q and k must be defined");
  require(q.dim() == 3 && k.dim() == 3, "q must be [H, S, d] and k [K, S, d]");
  require(q.is_floating_point() && k.scalar_type() == q.scalar_type(),
          "q and k must share one floating dtype");
  require(k.device() == q.device(), "q and k must be on one device");
  const int64_t H = q.size(0), S = q.size(1), d = q.size(2), K = k.size(0);
  require(K >= 1 && H % K == 0, "query heads H = " + std::to_string(H) +
                                    " must be a multiple of kv heads K = " + std::to_string(K));
  require(
      k.size(1) == S && k.size(2) == d,
      "k must be [K, S, d] with q's S = " + std::to_string(S) + " and d = " + std::to_string(d));
  check_length(S);
  return {H, K, H / K, S, d};
}

void check_target_args(const Shape& sh, const torch::Tensor& lse, int64_t w,
                       const TargetOptions& o) {
  require(lse.defined() && lse.dim() == 2 && lse.size(0) == sh.H && lse.size(1) == sh.S,
          "lse must be [H, S] = [" + std::to_string(sh.H) + ", " + std::to_string(sh.S) + "]");
  require(lse.is_floating_point(), "lse must be floating point");
  require(w >= 1, "window w must be >= 1, got " + std::to_string(w));
  require(o.eps > 0 && std::isfinite(o.eps), "eps must be > 0");
  require(std::isfinite(o.scale), "scale must be finite");
  require(o.block >= 1, "block must be >= 1, got " + std::to_string(o.block));
}

// log N_t = log max(1, S - (t + w)) for t in [t0, t1) (eq. 16).
torch::Tensor log_future_count(int64_t t0, int64_t t1, int64_t S, int64_t w,
                               const torch::TensorOptions& opt) {
  torch::Tensor t = torch::arange(t0, t1, opt);
  return torch::log(torch::clamp_min(S - (t + w), 1.0));
}

// [K, G, B] log mbar -> [K, B] log(eps + Agg_g mbar) (eq. 14 / 15), log-space so no mass
// underflows before the eps is added.
torch::Tensor aggregate(const torch::Tensor& log_mbar, const TargetOptions& o) {
  torch::Tensor agg = o.agg == TargetOptions::Max
                          ? std::get<0>(log_mbar.max(1))
                          : torch::logsumexp(log_mbar, 1) - std::log(double(log_mbar.size(1)));
  return torch::logaddexp(agg, torch::full_like(agg, std::log(o.eps)));
}

}  // namespace

torch::Tensor future_attention_target(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& lse, int64_t w, const TargetOptions& o) {
  const Shape sh = check_qk(q, k);
  check_target_args(sh, lse, w, o);
  torch::NoGradGuard no_grad;
  const auto opt = q.options();
  const torch::Tensor qg = q.reshape({sh.K, sh.G, sh.S, sh.d});
  const torch::Tensor lse_g = lse.to(q.scalar_type()).reshape({sh.K, sh.G, 1, sh.S});
  // Tokens with no future query keep mbar = 0, i.e. log(eps) (and N_t = 1).
  torch::Tensor out = torch::full({sh.K, sh.S}, std::log(o.eps), opt.dtype(torch::kFloat32));
  for (int64_t t0 = 0; t0 < sh.S; t0 += o.block) {
    const int64_t t1 = std::min(sh.S, t0 + o.block);
    const int64_t d0 = t0 + w;  // no query before d0 reaches any key of the block
    if (d0 >= sh.S) break;
    // D.2: the keys of the block act as queries, every query d >= d0 as a key; the logits are
    // l(d, t) (eq. 32) shifted by -lse_d (eq. 33).
    const torch::Tensor kb = k.slice(1, t0, t1).unsqueeze(1);                   // [K, 1, B, d]
    const torch::Tensor qd = qg.slice(2, d0, sh.S);                             // [K, G, D, d]
    torch::Tensor logits = torch::matmul(kb, qd.transpose(-1, -2)) * o.scale -  // [K, G, B, D]
                           lse_g.slice(3, d0, sh.S);
    const torch::Tensor t_idx = torch::arange(t0, t1, opt.dtype(torch::kLong)).unsqueeze(1);
    const torch::Tensor d_idx = torch::arange(d0, sh.S, opt.dtype(torch::kLong)).unsqueeze(0);
    logits.masked_fill_(d_idx < t_idx + w, -std::numeric_limits<double>::infinity());
    // Eq. 31: log mbar per group; a row without a future query is -inf, giving log(eps) below.
    torch::Tensor r = aggregate(torch::logsumexp(logits, -1), o);
    if (o.count_normalise) r = r - log_future_count(t0, t1, sh.S, w, opt);  // eq. 17
    out.slice(1, t0, t1).copy_(r);
  }
  return out;
}

torch::Tensor future_attention_target_dense(const torch::Tensor& q, const torch::Tensor& k,
                                            const torch::Tensor& lse, int64_t w,
                                            const TargetOptions& o) {
  const Shape sh = check_qk(q, k);
  check_target_args(sh, lse, w, o);
  torch::NoGradGuard no_grad;
  const auto opt = q.options();
  const torch::Tensor qg = q.reshape({sh.K, sh.G, sh.S, sh.d});
  const torch::Tensor logits =
      torch::matmul(qg, k.unsqueeze(1).transpose(-1, -2)) * o.scale;  // [K, G, d, t]
  torch::Tensor p =
      torch::exp(logits - lse.to(q.scalar_type()).reshape({sh.K, sh.G, sh.S, 1}));  // eq. 29
  const torch::Tensor d_idx = torch::arange(sh.S, opt.dtype(torch::kLong)).unsqueeze(1);
  const torch::Tensor t_idx = torch::arange(sh.S, opt.dtype(torch::kLong)).unsqueeze(0);
  p = p.masked_fill(d_idx < t_idx + w, 0.0);  // d >= t + w (implies causal, w >= 1)
  const torch::Tensor mbar = p.sum(2);        // [K, G, S], eq. 13
  const torch::Tensor agg =
      o.agg == TargetOptions::Max ? std::get<0>(mbar.max(1)) : mbar.mean(1);  // eq. 14 / 15
  torch::Tensor r = torch::log(o.eps + agg);
  if (o.count_normalise) r = r - log_future_count(0, sh.S, sh.S, w, opt);  // eq. 17
  return r.to(torch::kFloat32);
}

// ---- Sparse attention -----------------------------------------------------

namespace {

// [K][S] int32 -> [K, S] int64 on `opt`'s device, checking the sizes.
torch::Tensor per_head_table(const std::vector<std::vector<int32_t>>& table, int64_t K, int64_t S,
                             const char* name, const torch::TensorOptions& opt) {
  require(static_cast<int64_t>(table.size()) == K,
          std::string(name) + " must have one row per kv head (" + std::to_string(K) + "), got " +
              std::to_string(table.size()));
  torch::Tensor out = torch::empty({K, S}, torch::kLong);
  auto a = out.accessor<int64_t, 2>();
  for (int64_t h = 0; h < K; ++h) {
    require(static_cast<int64_t>(table[h].size()) == S,
            std::string(name) + "[" + std::to_string(h) + "] must have S = " + std::to_string(S) +
                " entries, got " + std::to_string(table[h].size()));
    for (int64_t t = 0; t < S; ++t) a[h][t] = table[h][t];
  }
  return out.to(opt.device());
}

// Eq. 26 for queries [q0, q1) and keys [0, q1): [K, B, q1] bool.
torch::Tensor block_mask(const torch::Tensor& rank, const torch::Tensor& cutoff, int64_t q0,
                         int64_t q1, int64_t s, int64_t w) {
  const auto opt = rank.options();
  const torch::Tensor qi = torch::arange(q0, q1, opt).unsqueeze(1);  // [B, 1]
  const torch::Tensor ti = torch::arange(0, q1, opt).unsqueeze(0);   // [1, T]
  const torch::Tensor causal = ti <= qi;
  const torch::Tensor sink = ti < s;
  const torch::Tensor recent = qi - ti < w;
  const torch::Tensor eligible = (ti >= s) & (ti <= qi - w);
  const torch::Tensor selected =
      rank.slice(1, 0, q1).unsqueeze(1) <= cutoff.slice(1, q0, q1).unsqueeze(2);  // [K, B, T]
  return causal & (sink | recent | (eligible & selected));
}

}  // namespace

SparseAttention sparse_attention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v,
                                 const std::vector<std::vector<int32_t>>& ranks,
                                 const std::vector<std::vector<int32_t>>& cutoffs, int64_t s,
                                 int64_t w, double scale, int64_t block) {
  const Shape sh = check_qk(q, k);
  require(v.defined() && v.dim() == 3 && v.size(0) == sh.K && v.size(1) == sh.S,
          "v must be [K, S, dv] with k's K and S");
  require(v.scalar_type() == q.scalar_type() && v.device() == q.device(),
          "v must share q's dtype and device");
  check_budget(sh.S, s, w, 0);
  require(block >= 1, "block must be >= 1, got " + std::to_string(block));
  const auto long_opt = q.options().dtype(torch::kLong);
  const torch::Tensor rank = per_head_table(ranks, sh.K, sh.S, "ranks", long_opt);
  const torch::Tensor cutoff = per_head_table(cutoffs, sh.K, sh.S, "cutoffs", long_opt);
  const torch::Tensor qg = q.reshape({sh.K, sh.G, sh.S, sh.d});
  std::vector<torch::Tensor> outs, lses;
  for (int64_t q0 = 0; q0 < sh.S; q0 += block) {
    const int64_t q1 = std::min(sh.S, q0 + block);
    const torch::Tensor mask = block_mask(rank, cutoff, q0, q1, s, w).unsqueeze(1);  // [K,1,B,T]
    torch::Tensor logits =
        torch::matmul(qg.slice(2, q0, q1), k.slice(1, 0, q1).unsqueeze(1).transpose(-1, -2)) *
        scale;  // [K, G, B, T]
    logits = logits.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
    // Every row keeps its own query (w >= 1), so no row is all -inf.
    outs.push_back(torch::matmul(torch::softmax(logits, -1), v.slice(1, 0, q1).unsqueeze(1)));
    lses.push_back(torch::logsumexp(logits.detach(), -1));  // eq. 34, a constant of the target
  }
  if (sh.S == 0) return {q.new_zeros({sh.H, 0, v.size(2)}), q.new_zeros({sh.H, 0}).detach()};
  return {torch::cat(outs, 2).reshape({sh.H, sh.S, v.size(2)}),
          torch::cat(lses, 2).reshape({sh.H, sh.S})};
}

torch::Tensor sparse_mask_dense(const std::vector<std::vector<int32_t>>& ranks,
                                const std::vector<std::vector<int32_t>>& cutoffs, int64_t S,
                                int64_t s, int64_t w) {
  check_budget(S, s, w, 0);
  const int64_t K = static_cast<int64_t>(ranks.size());
  require(static_cast<int64_t>(cutoffs.size()) == K, "ranks and cutoffs must have K rows each");
  torch::Tensor m = torch::zeros({K, S, S}, torch::kBool);
  auto a = m.accessor<bool, 3>();
  for (int64_t h = 0; h < K; ++h) {
    require(
        static_cast<int64_t>(ranks[h].size()) == S && static_cast<int64_t>(cutoffs[h].size()) == S,
        "ranks and cutoffs rows must have S entries");
    for (int64_t q = 0; q < S; ++q)
      for (int64_t t = 0; t <= q; ++t) {
        const bool eligible = t >= s && t <= q - w;
        a[h][q][t] = t < s || q - t < w || (eligible && kept(ranks[h][t], cutoffs[h][q]));
      }
  }
  return m;
}

// ---- Boundary loss --------------------------------------------------------

torch::Tensor margin_weights(const torch::Tensor& margin, double w_min, double tau_w) {
  require(margin.defined() && margin.is_floating_point(), "margin must be a floating tensor");
  require(w_min >= 0 && w_min <= 1, "w_min must be in [0, 1], got " + std::to_string(w_min));
  require(tau_w > 0, "tau_w must be > 0, got " + std::to_string(tau_w));
  torch::NoGradGuard no_grad;
  return w_min + (1 - w_min) * torch::sigmoid(margin.detach() / tau_w);  // eq. 23
}

torch::Tensor balance_weights(const torch::Tensor& y, const torch::Tensor& head, int64_t n_heads,
                              double c_min, double c_max) {
  require(y.defined() && y.dim() == 1 && y.is_floating_point(), "y must be a floating [N] tensor");
  require(head.defined() && head.dim() == 1 && head.size(0) == y.size(0) &&
              head.scalar_type() == torch::kLong,
          "head must be an int64 [N] tensor matching y");
  require(n_heads >= 1, "n_heads must be >= 1");
  require(c_min > 0 && c_min <= c_max, "need 0 < c_min <= c_max");
  torch::NoGradGuard no_grad;
  const torch::Tensor yd = y.detach().to(torch::kFloat64);
  require(((yd == 1) | (yd == -1) | (yd == 0)).all().item<bool>(), "y must be in {-1, 0, +1}");
  if (head.numel() > 0)
    require(head.min().item<int64_t>() >= 0 && head.max().item<int64_t>() < n_heads,
            "head indices must be in 0..n_heads-1");
  const torch::Tensor valid = (yd != 0).to(torch::kFloat64);
  const torch::Tensor pos = (yd > 0).to(torch::kFloat64);
  const torch::Tensor n_valid = torch::zeros({n_heads}, yd.options()).index_add_(0, head, valid);
  const torch::Tensor n_pos = torch::zeros({n_heads}, yd.options()).index_add_(0, head, pos);
  const torch::Tensor rho = (n_pos / n_valid.clamp_min(1)).index_select(0, head);
  // The branch a label uses always has a nonzero denominator; the other may be inf, which the
  // clip turns into c_max before `where` discards it.
  const torch::Tensor w_keep = (1 / (2 * rho)).clamp(c_min, c_max);
  const torch::Tensor w_drop = (1 / (2 * (1 - rho))).clamp(c_min, c_max);
  const torch::Tensor w = torch::where(yd > 0, w_keep, w_drop) * valid;  // eq. 24
  const double total = valid.sum().item<double>();
  if (total == 0) return torch::zeros_like(y);
  return (w / (w.sum() / total)).to(y.scalar_type());
}

torch::Tensor boundary_loss(const torch::Tensor& r_new, const torch::Tensor& r_bnd,
                            const torch::Tensor& y, const torch::Tensor& weight, double tau) {
  require(r_new.defined() && r_bnd.defined() && y.defined(), "r_new, r_bnd and y must be defined");
  require(r_new.dim() == 1 && r_new.sizes() == r_bnd.sizes() && r_new.sizes() == y.sizes(),
          "r_new, r_bnd and y must be [N] tensors of one size");
  require(!weight.defined() || weight.sizes() == r_new.sizes(), "weight must be [N] like r_new");
  require(tau > 0, "tau must be > 0, got " + std::to_string(tau));
  if (r_new.numel() == 0) return (r_new.sum() + r_bnd.sum()) * 0;
  // Eq. 7: only the raw-score difference matters; the decay term cancels at a fixed q.
  torch::Tensor l = torch::softplus(-y.detach() * (r_new - r_bnd) / tau);
  if (weight.defined()) l = l * weight.detach();
  return l.mean();
}

}  // namespace kvscope::gates::kvpop
