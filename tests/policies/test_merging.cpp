// Merge-on-evict (`+merge`, kvpress MergingPress): the survivors' values
// after the prefill against the blend computed here from the prompt's keys
// and values, and the recorded merges against the evictions.
#include <cmath>
#include <map>

#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

TEST_CASE("merge: each leaving value folds into its most similar survivor, weighted",
          "[policies][merge]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t n = int64_t(prompt.size()), budget = 12;
  PolicyRun run(*model, "knorm:budget=" + std::to_string(budget) + "+merge", n + 1, n);
  run.feed(*model, prompt, 0);
  const model::ModelConfig& c = model->config();
  const int64_t hd = c.head_dim;
  REQUIRE(!run.last_merges().empty());
  std::map<std::tuple<int64_t, int64_t, int64_t>, const trace::MergeRow*> merged;
  for (const trace::MergeRow& m : run.last_merges()) merged[{m.layer, m.kv_head, m.token}] = &m;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerInputs& in = run.steps()[0][size_t(l)];  // the prompt's keys and values
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      INFO("layer " << l << ", kv head " << h);
      const std::set<int64_t> kept = run.held(l, h);
      REQUIRE(int64_t(kept.size()) == budget);
      auto key = [&](int64_t p) { return in.k[p][h].to(torch::kFloat64); };
      auto value = [&](int64_t p) { return in.v[p][h].to(torch::kFloat64); };
      std::map<int64_t, torch::Tensor> acc;
      std::map<int64_t, double> wsum;
      for (int64_t e = 0; e < n; ++e) {
        if (kept.count(e)) continue;
        // The survivor of largest cosine similarity (first on a tie).
        int64_t target = -1;
        double best = -2;
        for (int64_t t : kept) {
          const double cos = (key(e) / key(e).norm().clamp_min(1e-6))
                                 .dot(key(t) / key(t).norm().clamp_min(1e-6))
                                 .item<double>();
          if (cos > best) best = cos, target = t;
        }
        const double ve = value(e).norm().item<double>(), vt = value(target).norm().item<double>();
        const double w = std::max(best, 0.0) * ve / (ve + vt + 1e-6);
        auto it = merged.find({l, h, e});
        if (w > 0) {
          REQUIRE(it != merged.end());
          CHECK(it->second->into == target);
          CHECK(it->second->weight == Approx(w).epsilon(1e-4));
          if (!acc.count(target)) acc[target] = torch::zeros({hd}, torch::kFloat64);
          acc[target] += w * value(e);
          wsum[target] += w;
        } else {
          CHECK(it == merged.end());
        }
      }
      std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
      for (int64_t t : kept) {
        run.cache().read_entry(l, h, t, k.data(), v.data());
        const torch::Tensor want = acc.count(t) ? (value(t) + acc[t]) / (1 + wsum[t]) : value(t);
        const torch::Tensor got = torch::tensor(v).to(torch::kFloat64);
        CHECK((got - want).abs().max().item<double>() < 1e-5);
        // Keys are never merged.
        CHECK((torch::tensor(k).to(torch::kFloat64) - key(t)).abs().max().item<double>() == 0);
      }
    }
  }
  // Every merged entry left in the same step.
  for (const trace::MergeRow& m : run.last_merges())
    CHECK(!run.cache().holds(m.layer, m.kv_head, m.token));
}

TEST_CASE("merge: contradictory wrappers and bad fractions are refused", "[policies][merge]") {
  CHECK_THAT(policy_error("knorm+merge:fraction=0"), Catch::Contains("merge:fraction"));
  CHECK_THAT(policy_error("knorm+merge:threshold=2"), Catch::Contains("threshold"));
  CHECK_THAT(policy_error("knorm+adakv+merge"), Catch::Contains("merge"));
}

}  // namespace kvscope::test
