// Each policy's kept set after a one-step prefill of a real story on
// stories260K, against a reference written from the paper's definition and
// computed from the run's recorded queries and keys.
#include <cmath>
#include <fstream>
#include <limits>

#include "capture/policy/policies/descriptors.h"
#include "tests/policies/reference.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

struct Prefill {
  std::unique_ptr<model::Transformer> model = load_stories();
  std::vector<int64_t> ids = story_prompt_ids();
  int64_t n() const { return int64_t(ids.size()); }
  const model::ModelConfig& config() const { return model->config(); }
  std::unique_ptr<PolicyRun> run(const std::string& spec, int64_t decode = 0) {
    auto r = std::make_unique<PolicyRun>(*model, spec, n() + decode + 1, n());
    r->generate(*model, ids, decode);
    return r;
  }
  // probs [H, n, n] of layer l, recomputed from the recorded prefill.
  torch::Tensor probs(const PolicyRun& r, int64_t l) const {
    const LayerInputs& in = r.steps()[0][size_t(l)];
    return reference_attention(in.q, in.k, 0, in.scale);
  }
};

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("the story prompt is long enough to compress") {
  Prefill p;
  REQUIRE(p.n() >= 50);
  REQUIRE(p.config().n_kv_heads < p.config().n_heads);  // GQA: groups are exercised
}

TEST_CASE("tova keeps the top tokens of the last query's layer-mean attention") {
  Prefill p;
  const int64_t B = 20;
  auto run = p.run("tova:budget=" + std::to_string(B));
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor last = p.probs(*run, l).select(1, p.n() - 1).mean(0);  // [n] mean over all heads
    std::vector<double> s(size_t(p.n()));
    for (int64_t j = 0; j < p.n(); ++j) s[size_t(j)] = last[j].item<double>();
    const std::set<int64_t> expected = top_k(range(0, p.n()), s, B);
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      INFO("layer " << l << " head " << h);
      CHECK(describe(run->held(l, h)) == describe(expected));
    }
  }
}

TEST_CASE("snapkv keeps the window and the top pooled window votes per head") {
  Prefill p;
  const int64_t B = 24, W = 8, kernel = 5;
  auto run = p.run("snapkv:budget=24,window=8,kernel=5");
  const int64_t R = p.config().n_heads / p.config().n_kv_heads;
  int64_t differs_from_unpooled = 0;
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor probs = p.probs(*run, l);
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      INFO("layer " << l << " head " << h);
      const std::set<int64_t> expected = ref::snapkv_kept(probs, h, R, p.n(), B, W, kernel);
      CHECK(describe(run->held(l, h)) == describe(expected));
      differs_from_unpooled += expected != ref::snapkv_kept(probs, h, R, p.n(), B, W, 1);
    }
  }
  CHECK(differs_from_unpooled > 0);  // the pooling matters on this prompt
}

TEST_CASE("snapkv max pooling follows the same definition") {
  Prefill p;
  auto run = p.run("snapkv:budget=24,window=8,kernel=3,pooling=max");
  const int64_t R = p.config().n_heads / p.config().n_kv_heads;
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor probs = p.probs(*run, l);
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      std::vector<double> votes = ref::snapkv_votes(probs, h, R, 8);
      std::set<int64_t> expected = top_k(
          range(0, p.n() - 8), ref::pool(range(0, p.n() - 8), votes, 3, true, size_t(p.n())), 16);
      for (int64_t j = p.n() - 8; j < p.n(); ++j) expected.insert(j);
      INFO("layer " << l << " head " << h);
      CHECK(describe(run->held(l, h)) == describe(expected));
    }
  }
}

TEST_CASE("pyramidkv budgets shrink linearly with depth and average the budget") {
  // PyramidKV: top layer prefix budget P / beta, bottom 2P - P / beta.
  const std::vector<int64_t> b = policy::pyramid_budgets(5, 40, 8, 4.0);
  REQUIRE(b.size() == 5);
  const double P = 32, top = P / 4, bottom = 2 * P - top;
  for (int64_t l = 0; l < 5; ++l)
    CHECK(b[size_t(l)] == 8 + std::llround(bottom - double(l) * (bottom - top) / 4.0));
  CHECK(b.front() > b.back());
  CHECK(std::abs((b[0] + b[1] + b[2] + b[3] + b[4]) / 5.0 - 40.0) <= 1.0);
}

TEST_CASE("pyramidkv keeps snapkv's choice at each layer's own budget") {
  Prefill p;
  auto run = p.run("pyramidkv:budget=24,window=8,kernel=5,beta=4");
  const std::vector<int64_t> budgets = policy::pyramid_budgets(p.config().n_layers, 24, 8, 4.0);
  const int64_t R = p.config().n_heads / p.config().n_kv_heads;
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor probs = p.probs(*run, l);
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      INFO("layer " << l << " head " << h << " budget " << budgets[size_t(l)]);
      CHECK(describe(run->held(l, h)) ==
            describe(ref::snapkv_kept(probs, h, R, p.n(), budgets[size_t(l)], 8, 5)));
    }
  }
}

TEST_CASE("knorm keeps the keys of lowest L2 norm") {
  Prefill p;
  auto run = p.run("knorm:budget=20");
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor norms = run->steps()[0][size_t(l)].k.norm(2, -1);  // [n, K]
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      std::vector<double> s(size_t(p.n()));
      for (int64_t j = 0; j < p.n(); ++j) s[size_t(j)] = -norms[j][h].item<double>();
      INFO("layer " << l << " head " << h);
      CHECK(describe(run->held(l, h)) == describe(top_k(range(0, p.n()), s, 20)));
    }
  }
}

TEST_CASE("expected_attention keeps the sinks and the top expected attention x ||v||") {
  Prefill p;
  const int64_t B = 24, sinks = 4, n_future = 64;
  auto run = p.run("expected_attention:budget=24,sinks=4,n_future=64");
  int64_t below_float = 0;  // scores a float32 cannot hold (they would be 0)
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    const LayerInputs& in = run->steps()[0][size_t(l)];
    torch::Tensor q_pre =
        ref::queries_before_rope(*p.model, l, in.hidden).narrow(0, sinks, p.n() - sinks);
    for (int64_t h = 0; h < p.config().n_kv_heads; ++h) {
      std::vector<double> s = ref::expected_attention_scores(
          *p.model, q_pre, in.k, in.v, range(0, p.n()), h, p.n(), n_future, sinks, in.scale);
      // The policy's scores (recorded as gate values, natural logs) are the
      // reference's: 1e-3 in the log is 0.1% on the score.
      for (const trace::GateValue& g : run->last_gates())
        if (g.layer == l && g.kv_head == h && g.token >= sinks)
          CHECK(g.value == Approx(s[size_t(g.token)]).epsilon(0).margin(1e-3));
      for (int64_t j = sinks; j < p.n(); ++j)
        below_float += s[size_t(j)] < std::log(double(std::numeric_limits<float>::denorm_min()));
      std::set<int64_t> expected = top_k(range(sinks, p.n()), s, B - sinks);
      for (int64_t j = 0; j < sinks; ++j) expected.insert(j);
      INFO("layer " << l << " head " << h);
      CHECK(describe(run->held(l, h)) == describe(expected));
    }
  }
  // The ranking must hold where the scores themselves underflow a float.
  CHECK(below_float > 0);
}

TEST_CASE("adakv shares the layer budget across heads by snapkv score, with the safeguard") {
  Prefill p;
  const int64_t B = 20, W = 4, kernel = 5;
  const double alpha = 0.5;
  auto run = p.run("adakv:scorer=snapkv,budget=20,alpha=0.5,window=4,kernel=5");
  const int64_t K = p.config().n_kv_heads, R = p.config().n_heads / K;
  int64_t uneven_layers = 0;
  for (int64_t l = 0; l < p.config().n_layers; ++l) {
    torch::Tensor probs = p.probs(*run, l);
    // Ada-KV: every head keeps its window and its top floor(alpha B) - window
    // prefix entries; the rest of the layer's K x B goes to the best scores
    // of any head.
    struct E {
      double s;
      int64_t h, pos;
    };
    std::vector<E> rest;
    std::vector<std::set<int64_t>> expected(static_cast<size_t>(K));
    int64_t used = 0;
    for (int64_t h = 0; h < K; ++h) {
      std::vector<int64_t> prefix = range(0, p.n() - W);
      std::vector<double> s =
          ref::pool(prefix, ref::snapkv_votes(probs, h, R, W), kernel, false, size_t(p.n()));
      const int64_t own = int64_t(std::floor(alpha * B)) - W;
      std::set<int64_t> safe = top_k(prefix, s, own);
      expected[size_t(h)] = safe;
      for (int64_t j = p.n() - W; j < p.n(); ++j) expected[size_t(h)].insert(j);
      used += int64_t(expected[size_t(h)].size());
      for (int64_t j : prefix)
        if (!safe.count(j)) rest.push_back({s[size_t(j)], h, j});
    }
    std::sort(rest.begin(), rest.end(), [](const E& a, const E& b) {
      return a.s != b.s ? a.s > b.s : (a.pos != b.pos ? a.pos > b.pos : a.h < b.h);
    });
    for (int64_t i = 0; i < K * B - used; ++i)
      expected[size_t(rest[size_t(i)].h)].insert(rest[size_t(i)].pos);
    std::set<size_t> sizes;
    for (int64_t h = 0; h < K; ++h) {
      INFO("layer " << l << " head " << h);
      CHECK(describe(run->held(l, h)) == describe(expected[size_t(h)]));
      sizes.insert(run->held(l, h).size());
    }
    uneven_layers += sizes.size() > 1;
  }
  CHECK(uneven_layers > 0);  // the budget really moved between heads
}

TEST_CASE(
    "duo_attention: retrieval heads keep all, streaming heads sinks + recent, Lambda mask at "
    "prefill") {
  Prefill p;
  const std::string dir = temp_dir();
  const int64_t L = p.config().n_layers, K = p.config().n_kv_heads;
  {
    std::ofstream tsv(dir + "/full_attention_heads.tsv");
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h)
        tsv << (0.05 + 0.9 * double((l * 7 + h * 3) % 10) / 9.0) << (h + 1 < K ? "\t" : "\n");
    std::ofstream(dir + "/config.json") << R"({"sink_size": 2, "recent_size": 6})";
  }
  auto run = p.run("duo_attention:pattern=" + dir + ",sparsity=0.5");
  // The half of the heads with the lowest gate values stream.
  std::vector<std::pair<double, int64_t>> gates;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h)
      gates.push_back({0.05 + 0.9 * double((l * 7 + h * 3) % 10) / 9.0, l * K + h});
  std::stable_sort(gates.begin(), gates.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::set<int64_t> streaming;
  for (size_t i = 0; i < gates.size() / 2; ++i) streaming.insert(gates[i].second);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h) {
      INFO("layer " << l << " head " << h);
      if (streaming.count(l * K + h)) {
        std::set<int64_t> expected = {0, 1};
        for (int64_t j = p.n() - 6; j < p.n(); ++j) expected.insert(j);
        CHECK(describe(run->held(l, h)) == describe(expected));
        // Every prefill query put its weight on sinks, its recent 6 and itself only.
        const HeadProbs& hp = run->last_probs()[size_t(l)][size_t(h)];
        torch::Tensor w = hp.probs.sum(0);  // [n, m]
        double outside = 0;
        for (int64_t i = 0; i < p.n(); ++i)
          for (size_t j = 0; j < hp.key_pos.size(); ++j) {
            const int64_t kp = hp.key_pos[j];
            if (kp >= 2 && kp < i - 6) outside += w[i][int64_t(j)].item<double>();
          }
        CHECK(outside == 0.0);
      } else {
        CHECK(int64_t(run->held(l, h).size()) == p.n());
      }
    }
}

}  // namespace kvscope::test
