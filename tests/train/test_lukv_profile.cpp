// LU-KV's offline profile (`kvscope train --policy lukv`): the convex-hull
// relaxation (pool adjacent violators) against its definition, the greedy
// allocation against a brute-force optimum of the relaxed problem and a
// hand-worked case, and on stories260K a whole profile: the curve's shape,
// range, monotonicity in the ratio, its mean equal to the ratio, the policy
// reading it, determinism, and the refusals.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "capture/policy/registry.h"
#include "capture/train/lukv_profiling.h"
#include "core/common/input_error.h"
#include "core/common/npy_reader.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

std::vector<double> prefix_sums(const std::vector<double>& v) {
  std::vector<double> out(v.size() + 1, 0.0);
  for (size_t i = 0; i < v.size(); ++i) out[i + 1] = out[i] + v[i];
  return out;
}

// The best relaxed value of giving `extra` units to heads with these
// (non-increasing) slopes, by dynamic programming over the heads.
double best_relaxed_value(const std::vector<std::vector<double>>& slopes, int64_t extra) {
  std::vector<double> best(size_t(extra + 1), -1e300);
  best[0] = 0;
  for (const std::vector<double>& s : slopes) {
    const std::vector<double> u = prefix_sums(s);
    std::vector<double> next(best.size(), -1e300);
    for (int64_t have = 0; have <= extra; ++have)
      for (int64_t b = 0; b <= std::min<int64_t>(int64_t(s.size()), extra - have); ++b)
        next[size_t(have + b)] =
            std::max(next[size_t(have + b)], best[size_t(have)] + u[size_t(b)]);
    best = next;
  }
  return best[size_t(extra)];
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

gates::TrainOptions profile_options(const std::string& out) {
  gates::TrainOptions o;
  o.model.model = stories_model_path();
  o.model.tokenizer = stories_tokenizer_path();
  o.model.threads = 1;
  o.data.paths = {write_story_text("lukv-profile-text.txt", 20)};
  o.seq_len = 64;
  o.steps = 3;
  o.quiet = true;
  o.hyper_given = {{"scorer", "snapkv"}, {"window", 8}, {"future", 16}};
  o.output = out;
  return o;
}

std::string profile_error(gates::TrainOptions o) {
  try {
    gates::profile_lukv(o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("lukv profile: hull slopes are the least concave majorant's", "[gates][lukv]") {
  CHECK(gates::concave_hull_slopes({5, 4, 3}) == std::vector<double>{5, 4, 3});
  CHECK(gates::concave_hull_slopes({1, 2, 3}) == std::vector<double>{2, 2, 2});
  CHECK(gates::concave_hull_slopes({3, 1, 2}) == std::vector<double>{3, 1.5, 1.5});
  CHECK(gates::concave_hull_slopes({}).empty());
  std::mt19937 rng(7);
  std::exponential_distribution<double> importance(1.0);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> m(size_t(1 + trial % 17));
    for (double& x : m) x = importance(rng);
    const std::vector<double> s = gates::concave_hull_slopes(m);
    REQUIRE(s.size() == m.size());
    for (size_t i = 1; i < s.size(); ++i) CHECK(s[i] <= s[i - 1] + 1e-12);  // concave
    const std::vector<double> hull = prefix_sums(s), curve = prefix_sums(m);
    for (size_t b = 0; b < hull.size(); ++b) CHECK(hull[b] >= curve[b] - 1e-9);  // above
    CHECK(hull.back() == Approx(curve.back()));  // and meets it at the end
  }
}

TEST_CASE("lukv profile: the greedy allocation by hand and against the relaxed optimum",
          "[gates][lukv]") {
  // Two heads of 4 entries, one protected each: A's slopes 5, 1, 1, B's 3, 3, 0.
  const auto r = gates::lukv_sample_prune_ratios({1, 1}, {{5, 1, 1}, {3, 3, 0}}, 4);
  REQUIRE(r.size() == 99);
  CHECK(r[98] == std::vector<double>{0.75, 0.75});  // 1 %: budget 0 < the protected: those
  CHECK(r[62] == std::vector<double>{0.5, 0.75});   // 37 % of 8 = 3: A's 5
  CHECK(r[49] == std::vector<double>{0.5, 0.5});    // 4: then B's 3
  CHECK(r[24] == std::vector<double>{0.25, 0.25});  // 6: B's other 3, then A's first 1
  CHECK(r[0] == std::vector<double>{0.0, 0.0});     // 99 % of 8 rounds to 8: all
  // Equal slopes: the lower head first.
  CHECK(gates::lukv_sample_prune_ratios({0, 0}, {{2}, {2}}, 1)[49] ==
        std::vector<double>{0.0, 1.0});

  std::mt19937 rng(11);
  std::exponential_distribution<double> importance(1.0);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t heads = 2 + trial % 3, tokens = 6;
    std::vector<int64_t> forced(static_cast<size_t>(heads));
    std::vector<std::vector<double>> slopes;
    for (int64_t h = 0; h < heads; ++h) {
      forced[size_t(h)] = h % 2;
      std::vector<double> m(size_t(tokens - forced[size_t(h)]));
      for (double& x : m) x = importance(rng);
      slopes.push_back(gates::concave_hull_slopes(m));
    }
    const auto ratios = gates::lukv_sample_prune_ratios(forced, slopes, tokens);
    for (int64_t t : {10, 40, 70}) {
      double value = 0;
      int64_t extra = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kept = std::llround((1.0 - ratios[size_t(t)][size_t(h)]) * tokens);
        const std::vector<double> u = prefix_sums(slopes[size_t(h)]);
        value += u[size_t(kept - forced[size_t(h)])];
        extra += kept - forced[size_t(h)];
      }
      CHECK(value == Approx(best_relaxed_value(slopes, extra)).epsilon(1e-12));
    }
  }
}

TEST_CASE("lukv profile: a curve for stories260K that the policy reads", "[gates][lukv]") {
  const std::string dir = temp_dir();
  const std::string out = dir + "/stories-lukv.npy";
  gates::profile_lukv(profile_options(out));
  const NpyArray curve = read_npy(out);
  const generate::Engine engine = generate::open_engine(profile_options(out).model);
  const model::ModelConfig& c = engine.model->config();
  const int64_t L = c.n_layers, K = c.n_kv_heads, T = 64;
  REQUIRE(curve.shape == std::vector<int64_t>{99, L, K});
  // Each head keeps its 4 sinks and last position, SnapKV its window of 8:
  // at most 12 of 64 entries protected.
  for (int64_t t = 0; t < 99; ++t) {
    double mean = 0;
    for (int64_t i = 0; i < L * K; ++i) {
      const double r = curve.data[size_t(t * L * K + i)];
      CHECK(r >= 0.0);
      CHECK(r <= 1.0 - 5.0 / double(T) + 1e-6);
      if (t > 0) CHECK(r >= curve.data[size_t((t - 1) * L * K + i)] - 1e-6);  // nested budgets
      mean += r / double(L * K);
    }
    const double rho = double(t + 1) / 100.0;
    if ((1.0 - rho) * double(T) >= 13)  // above the protected entries, the mean is the ratio
      CHECK(mean == Approx(rho).margin(0.5 / double(L * K * T) + 1e-6));
  }
  // Heads differ: the point of the profile.
  double lo = 1, hi = 0;
  for (int64_t i = 0; i < L * K; ++i) {
    lo = std::min(lo, curve.data[size_t(49 * L * K + i)]);
    hi = std::max(hi, curve.data[size_t(49 * L * K + i)]);
  }
  CHECK(hi - lo > 0.05);

  const nlohmann::json meta = nlohmann::json::parse(file_bytes(dir + "/stories-lukv.json"));
  CHECK(meta["policy"] == "lukv");
  CHECK(meta["training"]["samples"] == 3);
  CHECK(meta["training"]["heldout"].size() == 3);

  policy::PolicyInstance pi =
      policy::make_policy("lukv:curve=" + out + ",scorer=snapkv,window=8,budget=16");
  pi.policy->setup({&c, 80, 64, 16});  // reads the curve: refused if misshapen

  const std::string again = dir + "/stories-lukv-again.npy";
  gates::profile_lukv(profile_options(again));
  CHECK(file_bytes(again) == file_bytes(out));  // deterministic
}

TEST_CASE("lukv profile: refusals name the option and what it takes", "[gates][lukv]") {
  const std::string dir = temp_dir();
  gates::TrainOptions o = profile_options(dir + "/refused-lukv.npy");
  gates::TrainOptions budget = o;
  budget.hyper_given["budget"] = 16;
  CHECK_THAT(profile_error(budget), Catch::Contains("--gate budget"));
  gates::TrainOptions ext = o;
  ext.output = dir + "/refused-lukv.safetensors";
  CHECK_THAT(profile_error(ext), Catch::Contains("ending in .npy"));
  gates::TrainOptions future = o;
  future.hyper_given["future"] = 0;
  CHECK_THAT(profile_error(future), Catch::Contains("[1, 65536]"));
  gates::TrainOptions scorer = o;
  scorer.hyper_given["scorer"] = "nonesuch";
  CHECK_THAT(profile_error(scorer), Catch::Contains("nonesuch"));
  gates::TrainOptions longer = o;
  longer.seq_len = 100000;
  CHECK_THAT(profile_error(longer), Catch::Contains("model's context"));
}

}  // namespace kvscope::test
