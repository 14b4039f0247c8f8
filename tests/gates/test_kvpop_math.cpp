// KVpop's building blocks (seed 003) against oracles: the Fenwick tree
// against a sorted multiset, the running cutoffs (Algorithm 2) against
// sorting E(q) at every query, the boundary pairs against a hand-worked
// example and a re-derivation by membership, the transposed future-attention
// target against the dense probability matrix, the blockwise sparse attention
// (values, lse, gradients) against a dense masked softmax, and the loss pieces
// against hand arithmetic and finite differences.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "capture/gates/kvpop_math.h"
#include "tests/gates/gate_test_util.h"

using namespace kvscope::gates;

namespace {

std::vector<float> random_scores(int64_t S, std::mt19937_64& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(S);
  for (float& v : x) v = n(rng);
  return x;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Brute force: eligible tokens of E(q) = {s..q-w} ordered best first.
std::vector<int64_t> eligible_best_first(const std::vector<int32_t>& rank, int64_t s, int64_t hi) {
  std::vector<int64_t> e;
  for (int64_t t = s; t <= hi; ++t) e.push_back(t);
  std::sort(e.begin(), e.end(), [&](int64_t a, int64_t b) { return rank[a] < rank[b]; });
  return e;
}

}  // namespace

TEST_CASE("kvpop: Fenwick k-th smallest equals a sorted multiset under random inserts and erases",
          "[kvpop]") {
  std::mt19937_64 rng(7);
  for (int64_t S : {1, 2, 7, 64, 100, 1000}) {
    kvpop::Fenwick tree(S);
    std::multiset<int32_t> ref;
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(S - 1));
    for (int step = 0; step < 600; ++step) {
      if (!ref.empty() && step % 5 == 4) {  // erase an existing rank now and then
        auto it = std::next(ref.begin(), static_cast<long>(rng() % ref.size()));
        tree.erase(*it);
        ref.erase(it);
      } else {
        const int32_t r = pick(rng);
        tree.insert(r);
        ref.insert(r);
      }
      REQUIRE(tree.count() == static_cast<int64_t>(ref.size()));
      int64_t k = 1;
      for (auto it = ref.begin(); it != ref.end(); ++it, ++k)
        if (k % 3 == 1 || k == static_cast<int64_t>(ref.size()))
          REQUIRE(tree.find_by_prefix_count(k) == *it);
    }
    REQUIRE_THROWS_AS(tree.find_by_prefix_count(0), std::invalid_argument);
    REQUIRE_THROWS_AS(tree.find_by_prefix_count(tree.count() + 1), std::invalid_argument);
    REQUIRE_THROWS_AS(tree.insert(static_cast<int32_t>(S)), std::invalid_argument);
  }
  kvpop::Fenwick t(4);
  t.insert(2);
  REQUIRE_THROWS_AS(t.erase(1), std::invalid_argument);
}

TEST_CASE("kvpop: static ranks order by priority, ties later-first, NaN rejected", "[kvpop]") {
  // priorities: t0 = 1, t1 = 3, t2 = 1, t3 = 3, t4 = 2. Best: t3 (3, later than t1), t1, t4,
  // t2 (1, later than t0), t0.
  const std::vector<float> p = {1, 3, 1, 3, 2};
  REQUIRE(kvpop::static_ranks(p.data(), 5) == std::vector<int32_t>{4, 1, 3, 0, 2});
  const std::vector<float> flat(6, 0.5f);
  REQUIRE(kvpop::static_ranks(flat.data(), 6) == std::vector<int32_t>{5, 4, 3, 2, 1, 0});
  const std::vector<float> bad = {0, NAN, 1};
  REQUIRE_THROWS_AS(kvpop::static_ranks(bad.data(), 3), std::invalid_argument);
  REQUIRE_THROWS_AS(kvpop::static_priority(bad.data(), 3, -0.1), std::invalid_argument);
  REQUIRE_THROWS_AS(kvpop::static_priority(p.data(), 5, 0.1), std::invalid_argument);

  // Eq. 20 with log(gamma) = -0.5: pbar = raw + 0.5 t. raw {2, 1, 0.5}: pbar {2, 1.5, 1.5}; the
  // tie goes to t2.
  const std::vector<float> raw = {2, 1, 0.5f};
  const std::vector<float> pbar = kvpop::static_priority(raw.data(), 3, -0.5);
  REQUIRE(pbar == std::vector<float>{2.f, 1.5f, 1.5f});
  REQUIRE(kvpop::static_ranks(pbar.data(), 3) == std::vector<int32_t>{0, 2, 1});
}

TEST_CASE("kvpop: running cutoffs equal sorting E(q) at every query, and keep min(k, |E(q)|)",
          "[kvpop]") {
  struct Budget {
    int64_t S, s, w, k;
  };
  // k larger than every eligible count (200 > 120 - 4 - 1), s = 0, w = 1, k = 0, tiny S.
  const std::vector<Budget> budgets = {{300, 4, 16, 32}, {257, 0, 1, 1},  {200, 0, 1, 50},
                                       {120, 4, 1, 200}, {500, 2, 64, 7}, {90, 0, 8, 0},
                                       {3, 5, 2, 1},     {1, 0, 1, 1},    {400, 1, 3, 100}};
  std::mt19937_64 rng(11);
  int64_t queries = 0;
  for (const Budget& b : budgets) {
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<float> raw = random_scores(b.S, rng);
      if (trial == 2)  // coarse scores: many ties in the priority
        for (float& x : raw) x = std::round(x);
      const auto pbar = kvpop::static_priority(raw.data(), b.S, trial == 0 ? 0.0 : -0.01);
      const auto rank = kvpop::static_ranks(pbar.data(), b.S);
      const auto fast = kvpop::running_cutoffs(rank.data(), b.S, b.s, b.w, b.k);
      const auto slow = kvpop::running_cutoffs_bruteforce(rank.data(), b.S, b.s, b.w, b.k);
      REQUIRE(fast == slow);
      for (int64_t q = 0; q < b.S; ++q, ++queries) {
        const int64_t n_eligible = std::max<int64_t>(0, q - b.w - b.s + 1);
        int64_t n_kept = 0;
        for (int64_t t = b.s; t <= q - b.w; ++t) n_kept += kvpop::kept(rank[t], fast[q]);
        INFO("S=" << b.S << " s=" << b.s << " w=" << b.w << " k=" << b.k << " q=" << q);
        REQUIRE(n_kept == std::min(b.k, n_eligible));
        REQUIRE((fast[q] == kvpop::kAllKept) == (n_eligible < b.k));
      }
    }
  }
  REQUIRE(queries > 5000);
  const std::vector<int32_t> not_perm = {0, 0, 1};
  REQUIRE_THROWS_AS(kvpop::running_cutoffs(not_perm.data(), 3, 0, 1, 1), std::invalid_argument);
  const std::vector<int32_t> perm = {0, 1, 2};
  REQUIRE_THROWS_AS(kvpop::running_cutoffs(perm.data(), 3, 0, 0, 1), std::invalid_argument);
  REQUIRE_THROWS_AS(kvpop::running_cutoffs(perm.data(), 3, -1, 1, 1), std::invalid_argument);
}

TEST_CASE("kvpop: boundary pairs on a hand-worked example", "[kvpop]") {
  // S = 8, s = 1, w = 2, k = 2; ranks (0 = best) per token:
  //   t:    0  1  2  3  4  5  6  7
  //   rank: 7  3  0  5  1  6  2  4
  // Pairs from q >= s + w + k = 5, t_new = q - w, t_bnd = 2nd best of E(q-1) = {1..q-3}:
  //   q=5: t_new=3 (rank 5); E(4) = {1 (3), 2 (0)} -> 2nd best t1 (rank 3); 5 < 3 no  -> y=-1
  //   q=6: t_new=4 (rank 1); E(5) = {1 (3), 2 (0), 3 (5)} -> t1 (rank 3);    1 < 3 yes -> y=+1
  //        (t_new is itself the 2nd best of E(6) = {t2, t4}; t_bnd is the displaced t1)
  //   q=7: t_new=5 (rank 6); E(6) = {1, 2, 3, 4} ranks {3, 0, 5, 1} -> t4 (rank 1) -> y=-1
  const std::vector<int32_t> rank = {7, 3, 0, 5, 1, 6, 2, 4};
  const kvpop::BoundaryPairs p = kvpop::boundary_pairs(rank.data(), 8, 1, 2, 2);
  REQUIRE(p.q == std::vector<int64_t>{5, 6, 7});
  REQUIRE(p.t_new == std::vector<int64_t>{3, 4, 5});
  REQUIRE(p.t_bnd == std::vector<int64_t>{1, 1, 4});
  REQUIRE(p.y == std::vector<float>{-1, 1, -1});
  // The cutoffs of the same example: |E(q)| = q - 2 >= 2 from q = 4: E(4) = {1, 2} -> rank 3,
  // E(5) adds rank 5 -> 3, E(6) adds rank 1 -> {0, 1} -> 1, E(7) adds rank 6 -> 1.
  REQUIRE(kvpop::running_cutoffs(rank.data(), 8, 1, 2, 2) ==
          std::vector<int32_t>{kvpop::kAllKept, kvpop::kAllKept, kvpop::kAllKept, kvpop::kAllKept,
                               3, 3, 1, 1});
  REQUIRE_THROWS_AS(kvpop::boundary_pairs(rank.data(), 8, 1, 2, 0), std::invalid_argument);
}

TEST_CASE("kvpop: boundary pairs equal a re-derivation by top-k membership on random data",
          "[kvpop]") {
  std::mt19937_64 rng(5);
  struct Budget {
    int64_t S, s, w, k;
  };
  for (const Budget& b : std::vector<Budget>{{200, 4, 8, 16}, {150, 0, 1, 1}, {90, 2, 5, 40}}) {
    const auto raw = random_scores(b.S, rng);
    const auto rank = kvpop::static_ranks(raw.data(), b.S);
    const kvpop::BoundaryPairs p = kvpop::boundary_pairs(rank.data(), b.S, b.s, b.w, b.k);
    REQUIRE(static_cast<int64_t>(p.q.size()) == b.S - (b.s + b.w + b.k));
    int n_keep = 0;
    for (size_t i = 0; i < p.q.size(); ++i) {
      const int64_t q = p.q[i], t_new = q - b.w;
      REQUIRE(q == b.s + b.w + b.k + static_cast<int64_t>(i));
      REQUIRE(p.t_new[i] == t_new);
      REQUIRE(p.t_bnd[i] == eligible_best_first(rank, b.s, q - 1 - b.w)[b.k - 1]);
      // y by membership: is t_new among the k best of E(q)?
      const auto now = eligible_best_first(rank, b.s, q - b.w);
      const bool in_top = std::find(now.begin(), now.begin() + b.k, t_new) != now.begin() + b.k;
      REQUIRE(p.y[i] == (in_top ? 1.f : -1.f));
      n_keep += in_top;
    }
    REQUIRE(n_keep > 0);  // both labels occur, so the comparison is exercised both ways
    REQUIRE(n_keep < static_cast<int>(p.q.size()));

    // Subsampling: distinct, ascending, a subset of all pairs, the same for a seed, late-biased.
    const int64_t m = static_cast<int64_t>(p.q.size()) / 3;
    const auto a = kvpop::boundary_pairs(rank.data(), b.S, b.s, b.w, b.k, m, 42);
    const auto again = kvpop::boundary_pairs(rank.data(), b.S, b.s, b.w, b.k, m, 42);
    const auto other = kvpop::boundary_pairs(rank.data(), b.S, b.s, b.w, b.k, m, 43);
    REQUIRE(static_cast<int64_t>(a.q.size()) == m);
    REQUIRE(a.q == again.q);
    REQUIRE(a.q != other.q);
    REQUIRE(std::is_sorted(a.q.begin(), a.q.end()));
    REQUIRE(std::adjacent_find(a.q.begin(), a.q.end()) == a.q.end());
    for (size_t i = 0; i < a.q.size(); ++i) {
      const size_t j = static_cast<size_t>(a.q[i] - p.q[0]);
      REQUIRE(a.t_bnd[i] == p.t_bnd[j]);
      REQUIRE(a.y[i] == p.y[j]);
    }
  }
  // Late bias: over many seeds, more samples fall in the later half of the valid positions.
  const std::vector<float> raw = random_scores(1000, rng);
  const auto rank = kvpop::static_ranks(raw.data(), 1000);
  int64_t late = 0, total = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto a = kvpop::boundary_pairs(rank.data(), 1000, 0, 1, 1, 50, seed);
    for (int64_t q : a.q) late += q >= 501, ++total;
  }
  // Expected share 0.5 (uniform) * 0.5 + 0.5 (sqrt) * 0.75 = 0.625.
  REQUIRE(static_cast<double>(late) / total > 0.57);
}

namespace {

struct Heads {
  torch::Tensor q, k, v;
};

Heads random_heads(int64_t H, int64_t K, int64_t S, int64_t d, uint64_t seed) {
  torch::manual_seed(seed);
  auto o = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::randn({H, S, d}, o), torch::randn({K, S, d}, o), torch::randn({K, S, d}, o)};
}

// Dense causal log-normaliser (eq. 28), [H, S], by the literal matrix.
torch::Tensor dense_lse(const Heads& x, double scale) {
  const int64_t H = x.q.size(0), K = x.k.size(0), S = x.q.size(1);
  torch::Tensor kr = x.k.repeat_interleave(H / K, 0);
  torch::Tensor l = torch::matmul(x.q, kr.transpose(1, 2)) * scale;
  torch::Tensor causal = torch::ones({S, S}, torch::kBool).tril();
  return torch::logsumexp(l.masked_fill(causal.logical_not(), -INFINITY), -1);
}

// Per kv head: ranks of random priorities and their running cutoffs.
void random_policy(int64_t K, int64_t S, int64_t s, int64_t w, int64_t k, uint64_t seed,
                   std::vector<std::vector<int32_t>>& ranks,
                   std::vector<std::vector<int32_t>>& cutoffs) {
  std::mt19937_64 rng(seed);
  ranks.clear();
  cutoffs.clear();
  for (int64_t h = 0; h < K; ++h) {
    const auto raw = random_scores(S, rng);
    ranks.push_back(kvpop::static_ranks(raw.data(), S));
    cutoffs.push_back(kvpop::running_cutoffs(ranks.back().data(), S, s, w, k));
  }
}

// softmax over the dense mask, [H, S, d] and lse [H, S]: the reference of sparse_attention.
std::pair<torch::Tensor, torch::Tensor> dense_masked_attention(const Heads& x,
                                                               const torch::Tensor& mask,
                                                               double scale) {
  const int64_t H = x.q.size(0), K = x.k.size(0);
  torch::Tensor kr = x.k.repeat_interleave(H / K, 0), vr = x.v.repeat_interleave(H / K, 0);
  torch::Tensor m = mask.repeat_interleave(H / K, 0);
  torch::Tensor l = (torch::matmul(x.q, kr.transpose(1, 2)) * scale).masked_fill(~m, -INFINITY);
  return {torch::matmul(torch::softmax(l, -1), vr), torch::logsumexp(l, -1)};
}

}  // namespace

TEST_CASE("kvpop: the transposed future-attention target equals the dense probability matrix",
          "[kvpop]") {
  const double scale = 1 / std::sqrt(8.0);
  int cases = 0;
  for (int64_t G : {1, 2}) {
    const int64_t K = 2, H = K * G, S = 37;
    Heads x = random_heads(H, K, S, 8, 100 + G);
    const torch::Tensor lse = dense_lse(x, scale);
    // The dense target with the dense lse is the literal eq. 2: softmax column sums.
    {
      kvpop::TargetOptions o;
      o.scale = scale;
      o.agg = kvpop::TargetOptions::Mean;
      const int64_t w = 3;
      torch::Tensor kr = x.k.repeat_interleave(G, 0);
      torch::Tensor l = torch::matmul(x.q, kr.transpose(1, 2)) * scale;
      torch::Tensor causal = torch::ones({S, S}, torch::kBool).tril();
      torch::Tensor p = torch::softmax(l.masked_fill(~causal, -INFINITY), -1);  // [H, d, t]
      torch::Tensor future = torch::ones({S, S}, torch::kBool).tril(-w);        // d >= t + w
      torch::Tensor mbar = (p * future).sum(1).reshape({K, G, S}).mean(1);
      REQUIRE(max_abs_diff(kvpop::future_attention_target_dense(x.q, x.k, lse, w, o),
                           torch::log(1e-6 + mbar)) < 1e-5);
    }
    for (int64_t w : {1, 4, 36, 40})
      for (int64_t block : {5, 8, 37, 128})
        for (auto agg : {kvpop::TargetOptions::Max, kvpop::TargetOptions::Mean})
          for (bool norm : {false, true}) {
            kvpop::TargetOptions o;
            o.scale = scale;
            o.agg = agg;
            o.count_normalise = norm;
            o.block = block;
            const torch::Tensor fast = kvpop::future_attention_target(x.q, x.k, lse, w, o);
            const torch::Tensor dense = kvpop::future_attention_target_dense(x.q, x.k, lse, w, o);
            INFO("G=" << G << " w=" << w << " block=" << block << " agg=" << agg
                      << " norm=" << norm);
            REQUIRE(fast.sizes() == torch::IntArrayRef{K, S});
            REQUIRE(fast.scalar_type() == torch::kFloat32);
            REQUIRE(max_abs_diff(fast, dense) < 1e-5);
            // No future query for t > S - 1 - w: log(eps) exactly, whatever the normalisation.
            for (int64_t t = std::max<int64_t>(0, S - w); t < S; ++t)
              REQUIRE(fast[0][t].item<float>() == Approx(std::log(1e-6)).epsilon(1e-6));
            if (w == 1) REQUIRE(fast[0][0].item<float>() > std::log(1e-6) + 1);  // nonzero mass
            ++cases;
          }
  }
  REQUIRE(cases == 2 * 4 * 4 * 2 * 2);
  // Max differs from mean with G = 2 (so the aggregation is really exercised).
  Heads x = random_heads(4, 2, 20, 8, 9);
  kvpop::TargetOptions mx, mn;
  mx.scale = mn.scale = scale;
  mn.agg = kvpop::TargetOptions::Mean;
  const torch::Tensor lse = dense_lse(x, scale);
  REQUIRE(max_abs_diff(kvpop::future_attention_target(x.q, x.k, lse, 2, mx),
                       kvpop::future_attention_target(x.q, x.k, lse, 2, mn)) > 1e-3);
  REQUIRE_THROWS_AS(kvpop::future_attention_target(x.q, x.k, lse.slice(1, 0, 5), 2, mx),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(
      kvpop::future_attention_target(x.q, x.k.slice(0, 0, 1).repeat({3, 1, 1}), lse, 2, mx),
      std::invalid_argument);
}

TEST_CASE("kvpop: sparse attention equals a dense masked softmax, values, lse and gradients",
          "[kvpop]") {
  struct Case {
    int64_t H, K, S, s, w, k, block;
  };
  const double scale = 0.4;
  for (const Case& c : std::vector<Case>{{2, 2, 40, 2, 4, 6, 7},
                                         {4, 2, 45, 0, 1, 3, 16},
                                         {4, 2, 33, 1, 5, 100, 128},
                                         {2, 1, 30, 3, 2, 0, 9}}) {
    INFO("H=" << c.H << " K=" << c.K << " S=" << c.S << " s=" << c.s << " w=" << c.w << " k=" << c.k
              << " block=" << c.block);
    std::vector<std::vector<int32_t>> ranks, cutoffs;
    random_policy(c.K, c.S, c.s, c.w, c.k, 17 + c.S, ranks, cutoffs);
    const torch::Tensor mask = kvpop::sparse_mask_dense(ranks, cutoffs, c.S, c.s, c.w);
    // The budget of eq. 1: every query sees at most s + w + k keys, exactly that once saturated.
    const torch::Tensor seen = mask.sum(-1);
    for (int64_t q = 0; q < c.S; ++q) {
      REQUIRE(seen[0][q].item<int64_t>() == std::min(q + 1, c.s + c.w + c.k));
    }
    Heads x = random_heads(c.H, c.K, c.S, 6, c.S);
    for (auto* t : {&x.q, &x.k, &x.v}) t->requires_grad_(true);
    const kvpop::SparseAttention sa =
        kvpop::sparse_attention(x.q, x.k, x.v, ranks, cutoffs, c.s, c.w, scale, c.block);
    const auto [ref_out, ref_lse] = dense_masked_attention(x, mask, scale);
    REQUIRE(max_abs_diff(sa.out, ref_out) < 1e-10);
    REQUIRE(max_abs_diff(sa.lse, ref_lse) < 1e-10);
    REQUIRE_FALSE(sa.lse.requires_grad());

    const torch::Tensor probe = torch::randn_like(sa.out);
    const auto g = torch::autograd::grad({(sa.out * probe).sum()}, {x.q, x.k, x.v});
    const auto g_ref = torch::autograd::grad({(ref_out * probe).sum()}, {x.q, x.k, x.v});
    for (int i = 0; i < 3; ++i) {
      REQUIRE(g[i].abs().max().item<double>() > 1e-3);  // the gradient reaches every input
      REQUIRE(max_abs_diff(g[i], g_ref[i]) < 1e-10);
    }
  }
  // Float32 runs the same code path within float rounding.
  std::vector<std::vector<int32_t>> ranks, cutoffs;
  random_policy(1, 20, 1, 2, 3, 3, ranks, cutoffs);
  Heads x = random_heads(2, 1, 20, 4, 3);
  const auto d = kvpop::sparse_attention(x.q, x.k, x.v, ranks, cutoffs, 1, 2, 0.5, 6);
  const auto f = kvpop::sparse_attention(x.q.to(torch::kFloat32), x.k.to(torch::kFloat32),
                                         x.v.to(torch::kFloat32), ranks, cutoffs, 1, 2, 0.5, 6);
  REQUIRE(max_abs_diff(d.out, f.out) < 1e-5);
  ranks.pop_back();
  REQUIRE_THROWS_AS(kvpop::sparse_attention(x.q, x.k, x.v, ranks, cutoffs, 1, 2, 0.5),
                    std::invalid_argument);
}

TEST_CASE("kvpop: the target from the sparse lse runs the same transposed pass", "[kvpop]") {
  // Algorithm 1 line 8-9: the sparse pass's lse feeds the target; it is smaller than the dense
  // one (a subset of the keys), so every future mass is at least the dense one.
  std::vector<std::vector<int32_t>> ranks, cutoffs;
  random_policy(2, 50, 2, 4, 8, 23, ranks, cutoffs);
  Heads x = random_heads(4, 2, 50, 8, 23);
  const double scale = 1 / std::sqrt(8.0);
  const auto sa = kvpop::sparse_attention(x.q, x.k, x.v, ranks, cutoffs, 2, 4, scale, 16);
  const torch::Tensor dense = dense_lse(x, scale);
  REQUIRE((sa.lse <= dense + 1e-12).all().item<bool>());
  kvpop::TargetOptions o;
  o.scale = scale;
  o.block = 12;
  const torch::Tensor sparse_t = kvpop::future_attention_target(x.q, x.k, sa.lse, 4, o);
  REQUIRE(max_abs_diff(sparse_t, kvpop::future_attention_target_dense(x.q, x.k, sa.lse, 4, o)) <
          1e-5);
  const torch::Tensor dense_t = kvpop::future_attention_target(x.q, x.k, dense, 4, o);
  REQUIRE((sparse_t >= dense_t - 1e-5).all().item<bool>());
}

TEST_CASE("kvpop: loss pieces equal hand arithmetic, boundary loss gradient by differences",
          "[kvpop]") {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  // Eq. 23, w_min = 0.2, tau_w = 1: margin 0 -> 0.2 + 0.8 * 0.5 = 0.6;
  // margin 2 -> 0.2 + 0.8 * sigmoid(2) = 0.2 + 0.8 * 0.8807970779778823 = 0.9046376623823058.
  const torch::Tensor mw = kvpop::margin_weights(torch::tensor({0.0, 2.0}, f64), 0.2, 1.0);
  REQUIRE(mw[0].item<double>() == Approx(0.6).epsilon(1e-12));
  REQUIRE(mw[1].item<double>() == Approx(0.9046376623823058).epsilon(1e-12));

  // Eq. 24, c_min = 0.6, c_max = 1.5.
  //   head 0: y = +1, +1, +1, -1 -> rho = 0.75: keep 1 / 1.5 = 0.6667, drop 1 / 0.5 = 2 -> 1.5
  //   head 1: y = -1, -1 (and one invalid 0) -> rho = 0: drop 1 / 2 = 0.5 -> clipped to 0.6
  //   raw = {2/3, 2/3, 2/3, 1.5, 0.6, 0.6, 0}; mean over the 6 valid = (2 + 1.5 + 1.2) / 6
  //       = 4.7 / 6 = 0.78333; weights = raw / 0.78333.
  const torch::Tensor y = torch::tensor({1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.0}, f64);
  const torch::Tensor head = torch::tensor({0, 0, 0, 0, 1, 1, 1}, torch::kLong);
  const torch::Tensor bw = kvpop::balance_weights(y, head, 2, 0.6, 1.5);
  const double mean = 4.7 / 6;
  const std::vector<double> want = {(2.0 / 3) / mean,
                                    (2.0 / 3) / mean,
                                    (2.0 / 3) / mean,
                                    1.5 / mean,
                                    0.6 / mean,
                                    0.6 / mean,
                                    0.0};
  for (int i = 0; i < 7; ++i) REQUIRE(bw[i].item<double>() == Approx(want[i]).epsilon(1e-12));
  REQUIRE(bw.slice(0, 0, 6).mean().item<double>() == Approx(1.0).epsilon(1e-12));
  REQUIRE_THROWS_AS(
      kvpop::balance_weights(torch::tensor({0.5}, f64), torch::tensor({0L}), 1, 0.5, 2),
      std::invalid_argument);
  REQUIRE_THROWS_AS(kvpop::balance_weights(y, head, 1, 0.6, 1.5), std::invalid_argument);

  // Eq. 7, tau = 0.5: r_new = {1, 0}, r_bnd = {0, 1}, y = {+1, +1}, weight = {1, 2}:
  //   softplus(-(1 - 0) / 0.5) = log(1 + e^-2) = 0.12692801104297263
  //   softplus(-(0 - 1) / 0.5) = log(1 + e^2)  = 2.1269280110429727
  //   mean(1 * 0.12692801 + 2 * 2.12692801) = (0.12692801 + 4.25385602) / 2 = 2.1903920165
  torch::Tensor r_new = torch::tensor({1.0, 0.0}, f64).requires_grad_(true);
  torch::Tensor r_bnd = torch::tensor({0.0, 1.0}, f64).requires_grad_(true);
  const torch::Tensor yy = torch::tensor({1.0, 1.0}, f64);
  const torch::Tensor ww = torch::tensor({1.0, 2.0}, f64);
  const torch::Tensor loss = kvpop::boundary_loss(r_new, r_bnd, yy, ww, 0.5);
  REQUIRE(loss.item<double>() ==
          Approx((0.12692801104297263 + 2 * 2.1269280110429727) / 2).epsilon(1e-12));
  // y = -1 flips the sign inside: softplus(2) and softplus(-2), unweighted mean = 1.1269280110.
  REQUIRE(kvpop::boundary_loss(r_new, r_bnd, -yy, torch::Tensor(), 0.5).item<double>() ==
          Approx((2.1269280110429727 + 0.12692801104297263) / 2).epsilon(1e-12));

  // No pairs: a zero that still backpropagates.
  torch::Tensor none = torch::zeros({0}, f64).requires_grad_(true);
  REQUIRE(
      kvpop::boundary_loss(none, none, torch::zeros({0}, f64), torch::Tensor(), 1).requires_grad());

  // Gradient against central differences on random inputs.
  torch::manual_seed(4);
  torch::Tensor a = torch::randn({6}, f64).requires_grad_(true);
  torch::Tensor b = torch::randn({6}, f64).requires_grad_(true);
  const torch::Tensor ys = torch::tensor({1.0, -1.0, 1.0, 1.0, -1.0, -1.0}, f64);
  const torch::Tensor wt = torch::rand({6}, f64) + 0.5;
  const auto g = torch::autograd::grad({kvpop::boundary_loss(a, b, ys, wt, 0.7)}, {a, b});
  torch::NoGradGuard no_grad;
  for (int which = 0; which < 2; ++which)
    for (int64_t i = 0; i < 6; ++i) {
      torch::Tensor x = which == 0 ? a : b;
      const double keep = x[i].item<double>(), h = 1e-6;
      x[i] = keep + h;
      const double up = kvpop::boundary_loss(a, b, ys, wt, 0.7).item<double>();
      x[i] = keep - h;
      const double down = kvpop::boundary_loss(a, b, ys, wt, 0.7).item<double>();
      x[i] = keep;
      REQUIRE(g[which][i].item<double>() == Approx((up - down) / (2 * h)).margin(1e-8));
    }
}
