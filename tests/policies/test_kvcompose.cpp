// KVCompose (`kvcompose`, kvpress KVComposePress): the counts on hand-made
// scores (composite slots per layer, layer 0's max, the floor, the
// unstructured per-head counts, ties), and on stories260K the whole policy
// against a reference recomputed here in double from the real second reading
// of the prompt: every score, the kept sets, one count per layer.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

namespace {

// Scores in sixteenths (exact in float): [L = 2][K = 2][T = 4].
std::vector<float> sixteenths(const std::vector<int>& v) {
  std::vector<float> out;
  for (int x : v) out.push_back(float(x) / 16.0f);
  return out;
}

}  // namespace

TEST_CASE("kvcompose: composite slots set one count per layer, layer 0 takes the max",
          "[policies][kvcompose]") {
  // Per head sorted: l0h0 15 13 3 1, l0h1 12 10 8 6, l1h0 6 5 5 2, l1h1 7 4 3 1.
  // Composite (mean) l0: 13.5 11.5 5.5 3.5, l1: 6.5 4.5 4 1.5.
  const std::vector<float> strong_first = sixteenths({15, 1, 3, 13, 8, 10, 12, 6,  //
                                                      5, 6, 2, 5, 1, 4, 7, 3});
  // The 4 best slots: 13.5, 11.5 (l0), 6.5 (l1), 5.5 (l0).
  CHECK(policy::kvcompose_counts(strong_first, 2, 2, 4, 2, true, false, 0) ==
        std::vector<int64_t>{3, 3, 1, 1});
  // head=max: l0 15 13 8 6, l1 7 5 5 2; the 4 best: 15, 13, 8 (l0), 7 (l1).
  CHECK(policy::kvcompose_counts(strong_first, 2, 2, 4, 2, true, true, 0) ==
        std::vector<int64_t>{3, 3, 1, 1});
  // Unstructured: the 8 best of the 16 per-head slots; 6 of l0h1 (rank 3)
  // and 6 of l1h0 (rank 0) tie, the lower head first.
  CHECK(policy::kvcompose_counts(strong_first, 2, 2, 4, 2, false, false, 0) ==
        std::vector<int64_t>{2, 4, 1, 1});
  // The weak layer first: layer 0 takes the strong layer's slots, so the two
  // tie at every rank and split the 4 slots (without the max l1 would get 3).
  std::vector<float> weak_first(strong_first.begin() + 8, strong_first.end());
  weak_first.insert(weak_first.end(), strong_first.begin(), strong_first.begin() + 8);
  CHECK(policy::kvcompose_counts(weak_first, 2, 2, 4, 2, true, false, 0) ==
        std::vector<int64_t>{2, 2, 2, 2});
  // floor 2: the first two ranks of each layer are lifted; 2 slots go to
  // layer 0, and layer 1 still keeps its floor.
  CHECK(policy::kvcompose_counts(strong_first, 2, 2, 4, 1, true, false, 2) ==
        std::vector<int64_t>{2, 2, 2, 2});
  // Both of the 2 slots are layer 0's; layer 1 still keeps 1 (kvpress's clamp).
  CHECK(policy::kvcompose_counts(strong_first, 2, 2, 4, 1, true, false, 0) ==
        std::vector<int64_t>{2, 2, 1, 1});
}

TEST_CASE("kvcompose: scores from the real second reading, kept sets and freed entries",
          "[policies][kvcompose]") {
  const bool structured = GENERATE(true, false);
  // task=max, group=mean (the default) or task=mean, group=max (per query head means).
  const bool mean_then_max = GENERATE(false, true);
  INFO("structured " << structured << ", task=mean,group=max " << mean_then_max);
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const std::vector<int32_t> prompt32(prompt.begin(), prompt.end());
  const int64_t T = int64_t(prompt.size()), R = c.n_heads / c.n_kv_heads, L = c.n_layers,
                K = c.n_kv_heads, budget = T / 4;
  const std::string spec = "kvcompose:budget=" + std::to_string(budget) +
                           (structured ? "" : ",structured=false") +
                           (mean_then_max ? ",task=mean,group=max" : "");
  PolicyRun run(*model, spec, 2 * T, T);
  const std::vector<policy::ReconstructionChunk> plan =
      run.policy().plan({prompt32, nullptr, c}).reconstruction;
  REQUIRE(plan.size() == 1u);
  CHECK(plan[0].ids == prompt32);
  CHECK(plan[0].softmax_keys.empty());
  run.driver().set_reconstruction(plan);
  run.feed(*model, prompt, 0);
  const int64_t prefill_steps = int64_t(run.steps().size());
  run.driver().set_side_pass(true);
  run.feed(*model, prompt, T);
  run.driver().set_side_pass(false);
  // Reference in double: max (or mean) over the repeat's queries of the real
  // softmax (whole cache + the repeat up to the query), mean (or max) over the
  // group, plus the mean over the layer's kv heads.
  std::vector<double> ref(size_t(L * K * T), 0.0);
  for (int64_t l = 0; l < L; ++l) {
    const LayerInputs& pre = run.steps()[0][size_t(l)];
    const LayerInputs& side = run.steps()[size_t(prefill_steps)][size_t(l)];
    const torch::Tensor ctx = pre.k.to(torch::kFloat64), own = side.k.to(torch::kFloat64),
                        q = side.q.to(torch::kFloat64);
    for (int64_t h = 0; h < K; ++h) {
      std::vector<double> group(size_t(T), 0.0);  // sum (or max) over the group
      for (int64_t g = h * R; g < (h + 1) * R; ++g) {
        std::vector<double> task(size_t(T), 0.0);  // max (or sum) over the queries
        for (int64_t i = 0; i < T; ++i) {
          const torch::Tensor k =
              torch::cat({ctx.select(1, h), own.select(1, h).narrow(0, 0, i + 1)});
          const torch::Tensor p = torch::softmax(k.matmul(q[i][g]) * side.scale, 0);
          const double* pp = p.contiguous().data_ptr<double>();
          for (int64_t j = 0; j < T; ++j)
            task[size_t(j)] = mean_then_max ? task[size_t(j)] + pp[j] / double(T)
                                            : std::max(task[size_t(j)], pp[j]);
        }
        for (int64_t j = 0; j < T; ++j)
          group[size_t(j)] = mean_then_max ? std::max(group[size_t(j)], task[size_t(j)])
                                           : group[size_t(j)] + task[size_t(j)] / double(R);
      }
      for (int64_t j = 0; j < T; ++j) ref[size_t((l * K + h) * T + j)] = group[size_t(j)];
    }
    for (int64_t j = 0; j < T; ++j) {
      double mean = 0;
      for (int64_t h = 0; h < K; ++h) mean += ref[size_t((l * K + h) * T + j)] / double(K);
      for (int64_t h = 0; h < K; ++h) ref[size_t((l * K + h) * T + j)] += mean;
    }
  }
  double worst = 0, top = 0;
  int64_t n_gates = 0;
  for (const trace::GateValue& gv : run.last_gates()) {
    worst = std::max(worst, std::abs(double(gv.value) -
                                     ref[size_t((gv.layer * K + gv.kv_head) * T + gv.token)]));
    ++n_gates;
  }
  for (double s : ref) top = std::max(top, s);
  CHECK(n_gates == L * K * T);
  CHECK(worst < 1e-5 * top);
  // Kept sets: each head's `count` best of the reference (near ties excepted).
  const std::vector<float> ref32(ref.begin(), ref.end());
  const std::vector<int64_t> counts =
      policy::kvcompose_counts(ref32, L, K, T, budget, structured, false, 0);
  int64_t total = 0, differ = 0;
  std::set<int64_t> layer_counts;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h) {
      const std::set<int64_t> held = run.held(l, h);
      const int64_t n = counts[size_t(l * K + h)];
      CHECK(int64_t(held.size()) == n);
      if (structured) CHECK(n == counts[size_t(l * K)]);
      layer_counts.insert(n);
      total += int64_t(held.size());
      std::vector<double> row(ref.begin() + (l * K + h) * T, ref.begin() + (l * K + h + 1) * T);
      std::vector<double> sorted = row;
      std::sort(sorted.rbegin(), sorted.rend());
      if (n == 0 || n == T) continue;
      const double cut = 0.5 * (sorted[size_t(n - 1)] + sorted[size_t(n)]);
      for (int64_t p = 0; p < T; ++p) {
        if (std::abs(row[size_t(p)] - cut) < 1e-6 * top) continue;  // a near tie with the cut
        if ((row[size_t(p)] > cut) != (held.count(p) == 1)) ++differ;
      }
    }
  CHECK(total == L * K * budget);
  CHECK(differ == 0);
  CHECK(layer_counts.size() > 1);                  // layers (or heads) keep unequal counts
  CHECK(run.cache().entries() == L * K * budget);  // really freed
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h)
      if (!run.held(l, h).empty()) CHECK(*run.held(l, h).rbegin() < T);  // the pass's entries left
}

TEST_CASE("kvcompose: bad parameters are refused with what is expected", "[policies][kvcompose]") {
  CHECK_THAT(policy_error("kvcompose:budget=0"),
             Catch::Contains("kvcompose:budget") && Catch::Contains("[1, "));
  CHECK_THAT(policy_error("kvcompose:floor=-1"),
             Catch::Contains("kvcompose:floor") && Catch::Contains("[0, "));
  CHECK_THAT(policy_error("kvcompose:task=sum"),
             Catch::Contains("kvcompose:task") && Catch::Contains("'max' or 'mean'"));
  CHECK_THAT(policy_error("kvcompose:head=min"), Catch::Contains("kvcompose:head"));
  CHECK(policy_error("kvcompose:task=mean,group=max").empty());
  CHECK_THAT(policy_error("kvcompose+keydiff"), Catch::Contains("reconstruction"));
  CHECK(policy_error("kvcompose:task=mean,head=max,v_norm=true,floor=4").empty());
}

}  // namespace kvscope::test
