// CaM (`cam`, kvpress CAMPress): the first compression recomputed here from
// the attention weights the decode steps saw — accumulated attention, the
// layer's kept set, the merge candidates, their windows and probabilities —
// and the merged values and /merges rows checked against it.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

namespace {

constexpr int64_t kBudget = 12, kEvery = 4, kWindow = 3, kSeed = 5;

}  // namespace

TEST_CASE("cam: the first compression keeps, merges and draws as the paper's equations say",
          "[policies][cam]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t n = int64_t(prompt.size());
  const model::ModelConfig& c = model->config();
  const int64_t L = c.n_layers, K = c.n_kv_heads, hd = c.head_dim;
  PolicyRun run(*model,
                "cam:budget=" + std::to_string(kBudget) + ",every=" + std::to_string(kEvery) +
                    ",merge_budget=" + std::to_string(kWindow) +
                    ",merge_seed=" + std::to_string(kSeed),
                n + kEvery + 1, n);
  // A[l][h][pos]: attention received from decode queries (group averaged).
  using PerHead = std::vector<std::map<int64_t, double>>;
  std::vector<PerHead> A(static_cast<size_t>(L), PerHead(static_cast<size_t>(K)));
  // The values as written, and the held sets before the compressing step.
  using HeldSets = std::vector<std::set<int64_t>>;
  std::vector<HeldSets> before(static_cast<size_t>(L), HeldSets(static_cast<size_t>(K)));
  std::vector<trace::MergeRow> merges;
  run.generate(*model, prompt, kEvery, [&](int64_t s) {
    if (s == 0) return;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h) {
        const HeadProbs& p = run.last_probs()[size_t(l)][size_t(h)];
        const torch::Tensor w = p.probs.to(torch::kFloat64).mean(0)[0];  // [m]
        for (size_t i = 0; i < p.key_pos.size(); ++i)
          A[size_t(l)][size_t(h)][p.key_pos[i]] += w[long(i)].item<double>();
        if (s == kEvery - 1) before[size_t(l)][size_t(h)] = run.held(l, h);
      }
    if (s == kEvery) merges = run.last_merges();
  });
  REQUIRE(!merges.empty());
  at::Generator gen = at::detail::createCPUGenerator(kSeed);
  size_t checked_merges = 0;
  for (int64_t l = 0; l < L; ++l) {
    INFO("layer " << l);
    // Held before the step: the prompt plus kEvery - 1 decode tokens, and the new one.
    std::vector<int64_t> held(before[size_t(l)][0].begin(), before[size_t(l)][0].end());
    held.push_back(n + kEvery - 1);
    REQUIRE(int64_t(held.size()) == n + kEvery);
    std::vector<double> score(held.size(), 0.0);
    for (size_t i = 0; i < held.size(); ++i)
      for (int64_t h = 0; h < K; ++h) score[i] += A[size_t(l)][size_t(h)][held[i]] / double(K);
    std::vector<size_t> order(held.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return score[a] < score[b]; });
    const size_t n_evict = held.size() - size_t(kBudget);
    std::vector<int64_t> kept;
    for (size_t i = n_evict; i < order.size(); ++i) kept.push_back(held[order[i]]);
    std::sort(kept.begin(), kept.end());
    for (int64_t h = 0; h < K; ++h) {
      const std::set<int64_t> now = run.held(l, h);
      CHECK(std::vector<int64_t>(now.begin(), now.end()) == kept);
    }
    // Candidates: the kEvery best of the evicted (later position on ties).
    std::vector<size_t> cand(order.begin(), order.begin() + long(n_evict));
    std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) {
      return score[a] > score[b] || (score[a] == score[b] && held[a] > held[b]);
    });
    cand.resize(std::min<size_t>(cand.size(), kEvery));
    std::vector<int64_t> merging;
    for (size_t i : cand) merging.push_back(held[i]);
    std::sort(merging.begin(), merging.end());
    const int64_t M = int64_t(merging.size());
    torch::Tensor prob = torch::zeros({1, K, M});
    std::vector<std::vector<int64_t>> windows;
    for (int64_t m : merging) {
      std::vector<int64_t> w;
      for (int64_t t : kept)
        if (t > m && int64_t(w.size()) < kWindow) w.push_back(t);
      windows.push_back(w);
    }
    for (int64_t h = 0; h < K; ++h)
      for (int64_t j = 0; j < M; ++j) {
        double mean = 0;
        for (int64_t t : windows[size_t(j)]) mean += A[size_t(l)][size_t(h)][t];
        mean /= double(std::max<size_t>(1, windows[size_t(j)].size()));
        double p = A[size_t(l)][size_t(h)][merging[size_t(j)]] / mean;
        prob[0][h][j] = float(std::isnan(p) ? 0.0 : std::clamp(p, 0.0, 1.0));
      }
    const torch::Tensor drawn = torch::bernoulli(prob, gen);
    for (int64_t h = 0; h < K; ++h) {
      INFO("kv head " << h);
      std::map<int64_t, torch::Tensor> want;
      auto value = [&](int64_t p) {
        const LayerInputs& in = run.steps()[size_t(p < n ? 0 : p - n + 1)][size_t(l)];
        return in.v[p < n ? p : 0][h].to(torch::kFloat64);
      };
      for (int64_t t : kept) want[t] = value(t);
      std::set<std::pair<int64_t, int64_t>> pairs;
      for (int64_t j = 0; j < M; ++j) {
        if (drawn[0][h][j].item<float>() == 0) continue;
        for (int64_t t : windows[size_t(j)]) {
          want[t] += value(merging[size_t(j)]) / double(windows[size_t(j)].size());
          pairs.insert({merging[size_t(j)], t});
        }
      }
      std::set<std::pair<int64_t, int64_t>> got_pairs;
      for (const trace::MergeRow& r : merges)
        if (r.layer == l && r.kv_head == h) {
          got_pairs.insert({r.token, r.into});
          CHECK(r.weight ==
                Approx(1.0 /
                       double(windows[size_t(std::find(merging.begin(), merging.end(), r.token) -
                                             merging.begin())]
                                  .size())));
        }
      CHECK(got_pairs == pairs);
      checked_merges += pairs.size();
      std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
      for (int64_t t : kept) {
        run.cache().read_entry(l, h, t, k.data(), v.data());
        CHECK((torch::tensor(v).to(torch::kFloat64) - want[t]).abs().max().item<double>() < 1e-5);
      }
    }
  }
  CHECK(checked_merges == merges.size());
}

TEST_CASE("cam: bad parameters are refused naming them", "[policies][cam]") {
  CHECK_THAT(policy_error("cam:merge_budget=0"), Catch::Contains("merge_budget"));
  CHECK_THAT(policy_error("cam:every=0"), Catch::Contains("every"));
  CHECK_THAT(policy_error("cam:window=8"), Catch::Contains("cam:window"));
  CHECK_THAT(policy_error("cam:scorer=bogus"), Catch::Contains("cam:scorer"));
  CHECK(policy_error("cam:scorer=snapkv,window=8").empty());
}

}  // namespace kvscope::test
