// Decode: every policy keeps working after the prefill. Budgets hold at every
// step, and the entries that leave are the ones the paper's score says (the
// reference recomputes the score from the step's own attention weights).
#include <cmath>
#include <deque>
#include <fstream>

#include "capture/policy/policies/descriptors.h"
#include "tests/policies/reference.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

constexpr int64_t kDecode = 12;

struct Setup {
  std::unique_ptr<model::Transformer> model = load_stories();
  std::vector<int64_t> ids = story_prompt_ids();
  int64_t n() const { return int64_t(ids.size()); }
  int64_t L() const { return model->config().n_layers; }
  int64_t K() const { return model->config().n_kv_heads; }
  int64_t R() const { return model->config().n_heads / model->config().n_kv_heads; }
};

// Positions evicted at the last step, per (layer, kv head).
std::vector<std::vector<std::vector<int64_t>>> evicted(const PolicyRun& run, int64_t L, int64_t K) {
  std::vector<std::vector<std::vector<int64_t>>> out(
      static_cast<size_t>(L), std::vector<std::vector<int64_t>>(static_cast<size_t>(K)));
  for (const trace::Event& e : run.last_events())
    if (e.kind == trace::EventKind::Evict)
      out[size_t(e.layer)][size_t(e.kv_head)].push_back(e.token);
  return out;
}

// Argmin of score over positions (ties to the older, as evict_to_budget).
int64_t argmin(const std::vector<int64_t>& positions, const std::function<double(int64_t)>& score) {
  int64_t best = -1;
  double low = 0;
  for (int64_t p : positions) {
    const double s = score(p);
    if (best < 0 || s < low || (s == low && p < best)) best = p, low = s;
  }
  return best;
}

}  // namespace

TEST_CASE("tova at decode: the layer-mean argmin of the current query leaves, budget holds") {
  Setup s;
  const int64_t B = 20;
  PolicyRun run(*s.model, "tova:budget=20", s.n() + kDecode + 1, s.n());
  int64_t checked = 0;
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    auto ev = evicted(run, s.L(), s.K());
    for (int64_t l = 0; l < s.L(); ++l) {
      for (int64_t h = 0; h < s.K(); ++h) REQUIRE(run.cache().count(l, h) == B);
      if (step == 0) continue;
      // Weights of the step's query, mean over all H heads, by position.
      std::map<int64_t, double> w;
      for (int64_t h = 0; h < s.K(); ++h) {
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        for (size_t j = 0; j < hp.key_pos.size(); ++j)
          w[hp.key_pos[j]] += hp.probs.select(1, 0).select(1, int64_t(j)).sum().item<double>() /
                              double(s.R() * s.K());
      }
      std::vector<int64_t> held_before;
      for (auto& [p, _] : w) held_before.push_back(p);
      const int64_t expected = argmin(held_before, [&](int64_t p) { return w[p]; });
      for (int64_t h = 0; h < s.K(); ++h) {
        INFO("step " << step << " layer " << l << " head " << h);
        REQUIRE(ev[size_t(l)][size_t(h)].size() == 1);
        CHECK(ev[size_t(l)][size_t(h)][0] == expected);
        ++checked;
      }
    }
  });
  CHECK(checked == kDecode * s.L() * s.K());
}

TEST_CASE("snapkv at decode: the sliding observation window votes, the window stays") {
  Setup s;
  const int64_t B = 20, W = 4, kernel = 3;
  PolicyRun run(*s.model, "snapkv:budget=20,window=4,kernel=3", s.n() + kDecode + 1, s.n());
  // rows[layer][head]: the decode queries' weights (mean over the group) by position.
  std::vector<std::vector<std::deque<std::map<int64_t, double>>>> rows(
      size_t(s.L()), std::vector<std::deque<std::map<int64_t, double>>>(size_t(s.K())));
  int64_t checked = 0;
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    const int64_t fed = run.driver().tokens_fed();
    auto ev = evicted(run, s.L(), s.K());
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h) {
        REQUIRE(run.cache().count(l, h) == B);
        for (int64_t p = fed - W; p < fed; ++p) REQUIRE(run.cache().holds(l, h, p));
        if (step == 0) continue;
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        std::map<int64_t, double> row;
        for (size_t j = 0; j < hp.key_pos.size(); ++j)
          row[hp.key_pos[j]] = hp.probs.select(1, 0).select(1, int64_t(j)).mean().item<double>();
        auto& ring = rows[size_t(l)][size_t(h)];
        ring.push_back(row);
        if (int64_t(ring.size()) > W) ring.pop_front();
        std::vector<double> votes(size_t(fed), 0.0);
        for (auto& r : ring)
          for (auto& [p, v] : r) votes[size_t(p)] += v;
        std::vector<int64_t> prefix;
        for (int64_t p : hp.key_pos)
          if (p < fed - W) prefix.push_back(p);
        std::sort(prefix.begin(), prefix.end());
        std::vector<double> pooled = ref::pool(prefix, votes, kernel, false, size_t(fed));
        INFO("step " << step << " layer " << l << " head " << h);
        REQUIRE(ev[size_t(l)][size_t(h)].size() == 1);
        CHECK(ev[size_t(l)][size_t(h)][0] ==
              argmin(prefix, [&](int64_t p) { return pooled[size_t(p)]; }));
        ++checked;
      }
  });
  CHECK(checked == kDecode * s.L() * s.K());
}

TEST_CASE("snapkv decode=false: the paper's prefill-only compression, the cache then grows") {
  Setup s;
  PolicyRun run(*s.model, "snapkv:budget=20,window=4,decode=false", s.n() + kDecode + 1, s.n());
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h) REQUIRE(run.cache().count(l, h) == 20 + step);
  });
}

TEST_CASE("knorm at decode: the held key of largest norm leaves") {
  Setup s;
  PolicyRun run(*s.model, "knorm:budget=20", s.n() + kDecode + 1, s.n());
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    auto ev = evicted(run, s.L(), s.K());
    for (int64_t l = 0; l < s.L(); ++l) {
      torch::Tensor norms = run.all_inputs(l).k.norm(2, -1);  // [fed, K]
      for (int64_t h = 0; h < s.K(); ++h) {
        REQUIRE(run.cache().count(l, h) == 20);
        if (step == 0) continue;
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        INFO("step " << step << " layer " << l << " head " << h);
        REQUIRE(ev[size_t(l)][size_t(h)].size() == 1);
        // Layer 0 keys of repeated tokens have equal norms (RoPE keeps the
        // norm): any of the tied largest norms may leave.
        const int64_t expected =
            argmin(hp.key_pos, [&](int64_t p) { return -norms[p][h].item<double>(); });
        const int64_t got = ev[size_t(l)][size_t(h)][0];
        CHECK(norms[got][h].item<double>() ==
              Approx(norms[expected][h].item<double>()).epsilon(1e-6));
      }
    }
  });
}

TEST_CASE(
    "criticalkv at decode: the lowest (base + epsilon) x ||v W_o||_1 leaves, new entries too") {
  // first_stage=0: every entry competes on the rescaled score; the norms of
  // the entries admitted at decode are computed once, the step they arrive.
  Setup s;
  const model::ModelConfig& c = s.model->config();
  PolicyRun run(*s.model, "criticalkv:scorer=knorm,budget=20,first_stage=0", s.n() + kDecode + 1,
                s.n());
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    auto ev = evicted(run, s.L(), s.K());
    for (int64_t l = 0; l < s.L(); ++l) {
      const LayerInputs all = run.all_inputs(l);
      const torch::Tensor wo = s.model->weights()
                                   .layers[size_t(l)]
                                   .wo.to(torch::kFloat64)
                                   .t()
                                   .reshape({c.n_heads, c.head_dim, -1});  // [H, hd, D]
      for (int64_t h = 0; h < s.K(); ++h) {
        REQUIRE(run.cache().count(l, h) == 20);
        if (step == 0) continue;
        const torch::Tensor v = all.v.select(1, h).to(torch::kFloat64);  // [fed, hd]
        const torch::Tensor l1 =
            v.unsqueeze(0).matmul(wo.narrow(0, h * s.R(), s.R())).abs().sum(-1).mean(0);
        const torch::Tensor kn = all.k.select(1, h).to(torch::kFloat64).norm(2, -1);
        auto score = [&](int64_t p) {
          return (-kn[p].item<double>() + 1e-4) * l1[p].item<double>();
        };
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        INFO("step " << step << " layer " << l << " head " << h);
        REQUIRE(ev[size_t(l)][size_t(h)].size() == 1);
        const int64_t got = ev[size_t(l)][size_t(h)][0];
        CHECK(score(got) == Approx(score(argmin(hp.key_pos, score))).epsilon(1e-5));
      }
    }
  });
}

TEST_CASE(
    "expected_attention at decode (refresh=1): statistics of every query so far, sinks stay") {
  Setup s;
  const int64_t sinks = 4, n_future = 64;
  PolicyRun run(*s.model, "expected_attention:budget=24,sinks=4,n_future=64,refresh=1",
                s.n() + kDecode + 1, s.n());
  int64_t agree = 0, checked = 0;
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    const int64_t fed = run.driver().tokens_fed();
    auto ev = evicted(run, s.L(), s.K());
    for (int64_t l = 0; l < s.L(); ++l) {
      LayerInputs all = run.all_inputs(l);
      torch::Tensor q_pre =
          ref::queries_before_rope(*s.model, l, all.hidden).narrow(0, sinks, fed - sinks);
      for (int64_t h = 0; h < s.K(); ++h) {
        REQUIRE(run.cache().count(l, h) == 24);
        for (int64_t p = 0; p < sinks; ++p) REQUIRE(run.cache().holds(l, h, p));
        if (step == 0) continue;
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        std::vector<double> sc = ref::expected_attention_scores(
            *s.model, q_pre, all.k, all.v, hp.key_pos, h, fed, n_future, sinks, all.scale);
        std::vector<int64_t> cand;
        for (int64_t p : hp.key_pos)
          if (p >= sinks) cand.push_back(p);
        REQUIRE(ev[size_t(l)][size_t(h)].size() == 1);
        ++checked;
        agree +=
            ev[size_t(l)][size_t(h)][0] == argmin(cand, [&](int64_t p) { return sc[size_t(p)]; });
      }
    }
  });
  // float32 statistics against float64 ones: allow one near-tie in the run.
  CHECK(checked == kDecode * s.L() * s.K());
  CHECK(agree >= checked - 1);
}

TEST_CASE("pyramidkv at decode: every layer stays at its own budget") {
  Setup s;
  PolicyRun run(*s.model, "pyramidkv:budget=24,window=4,beta=4", s.n() + kDecode + 1, s.n());
  const std::vector<int64_t> b = policy::pyramid_budgets(s.L(), 24, 4, 4.0);
  run.generate(*s.model, s.ids, kDecode, [&](int64_t) {
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h)
        REQUIRE(run.cache().count(l, h) == std::min(b[size_t(l)], run.driver().tokens_fed()));
  });
}

TEST_CASE("adakv at decode: the layer total holds and every head keeps its safeguard") {
  Setup s;
  for (const std::string scorer :
       {"snapkv,window=4", "tova,mean_heads=false", "knorm", "expected_attention"}) {
    PolicyRun run(*s.model, "adakv:budget=16,alpha=0.25,scorer=" + scorer, s.n() + kDecode + 1,
                  s.n());
    run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
      for (int64_t l = 0; l < s.L(); ++l) {
        int64_t total = 0;
        for (int64_t h = 0; h < s.K(); ++h) {
          INFO(scorer << " step " << step << " layer " << l << " head " << h);
          REQUIRE(run.cache().count(l, h) >= 4);
          total += run.cache().count(l, h);
        }
        REQUIRE(total == 16 * s.K());
      }
    });
  }
}

TEST_CASE("duo_attention at decode: streaming heads stay at sinks + recent, retrieval heads grow") {
  Setup s;
  const std::string tsv = temp_dir() + "/heads.tsv";
  {
    std::ofstream out(tsv);
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h)
        out << ((l + h) % 2 ? "0.9" : "0.1") << (h + 1 < s.K() ? "\t" : "\n");
  }
  PolicyRun run(*s.model, "duo_attention:pattern=" + tsv + ",threshold=0.5,sinks=2,recent=6",
                s.n() + kDecode + 1, s.n());
  run.generate(*s.model, s.ids, kDecode, [&](int64_t) {
    const int64_t fed = run.driver().tokens_fed();
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h) {
        std::set<int64_t> expected = {0, 1};
        for (int64_t p = fed - 6; p < fed; ++p) expected.insert(p);
        if ((l + h) % 2)
          CHECK(int64_t(run.held(l, h).size()) == fed);
        else
          CHECK(describe(run.held(l, h)) == describe(expected));
      }
  });
}

TEST_CASE("quest at decode: the top pages by the min/max bound are read, the cache is untouched") {
  Setup s;
  const int64_t P = 8, B = 24, dense = 2;
  PolicyRun run(*s.model, "quest:budget=24,page_size=8,dense_layers=2", s.n() + kDecode + 1, s.n());
  int64_t checked = 0;
  run.generate(*s.model, s.ids, kDecode, [&](int64_t step) {
    const int64_t fed = run.driver().tokens_fed();
    std::map<std::pair<int64_t, int64_t>, std::set<int64_t>>
        selected;  // (layer, head) -> page starts
    for (const trace::Event& e : run.last_events())
      if (e.kind == trace::EventKind::Select) selected[{e.layer, e.kv_head}].insert(e.token);
    for (int64_t l = 0; l < s.L(); ++l)
      for (int64_t h = 0; h < s.K(); ++h) {
        REQUIRE(run.cache().count(l, h) == fed);  // nothing leaves
        if (step == 0 || l < dense) {
          CHECK(selected[{l, h}].empty());
          continue;
        }
        // Quest's bound from the keys of each page and the step's queries.
        LayerInputs all = run.all_inputs(l);
        torch::Tensor q = run.steps().back()[size_t(l)].q[0];  // [H, hd]
        const int64_t pages = (fed + P - 1) / P;
        std::vector<double> bound(static_cast<size_t>(pages));
        for (int64_t p = 0; p < pages; ++p) {
          torch::Tensor keys =
              all.k.narrow(0, p * P, std::min(P, fed - p * P)).select(1, h);  // [rows, hd]
          torch::Tensor mn = std::get<0>(keys.min(0)), mx = std::get<0>(keys.max(0));
          for (int64_t r = 0; r < s.R(); ++r) {
            torch::Tensor qr = q[h * s.R() + r];
            bound[size_t(p)] += torch::maximum(qr * mn, qr * mx).sum().item<double>();
          }
        }
        std::vector<int64_t> ids;
        for (int64_t p = 0; p < pages; ++p) ids.push_back(p);
        std::set<int64_t> starts;
        for (int64_t p : top_k(ids, bound, B / P)) starts.insert(p * P);
        INFO("step " << step << " layer " << l << " head " << h);
        CHECK(describe(selected[{l, h}]) == describe(starts));
        // Attention really read only those pages (and the query's own key).
        const HeadProbs& hp = run.last_probs()[size_t(l)][size_t(h)];
        double outside = 0;
        for (size_t j = 0; j < hp.key_pos.size(); ++j)
          if (!starts.count(hp.key_pos[j] / P * P) && hp.key_pos[j] != fed - 1)
            outside += hp.probs.select(2, int64_t(j)).sum().item<double>();
        CHECK(outside == 0.0);
        ++checked;
      }
  });
  CHECK(checked == kDecode * (s.L() - dense) * s.K());
}

TEST_CASE("h2o (review): kept set after the prefill = recent window + top accumulated attention") {
  Setup s;
  PolicyRun run(*s.model, "h2o:heavy=12,recent=8", s.n() + 1, s.n());
  run.generate(*s.model, s.ids, 0);
  for (int64_t l = 0; l < s.L(); ++l) {
    const LayerInputs& in = run.steps()[0][size_t(l)];
    torch::Tensor probs = reference_attention(in.q, in.k, 0, in.scale);  // [H, n, n]
    for (int64_t h = 0; h < s.K(); ++h) {
      // H2O: score = attention summed over every query (mean over the group).
      torch::Tensor acc = probs.narrow(0, h * s.R(), s.R()).mean(0).sum(0);
      std::vector<double> sc(size_t(s.n()));
      std::vector<int64_t> old;
      for (int64_t j = 0; j < s.n(); ++j) sc[size_t(j)] = acc[j].item<double>();
      for (int64_t j = 0; j < s.n() - 8; ++j) old.push_back(j);
      std::set<int64_t> expected = top_k(old, sc, 12);
      for (int64_t j = s.n() - 8; j < s.n(); ++j) expected.insert(j);
      INFO("layer " << l << " head " << h);
      CHECK(describe(run.held(l, h)) == describe(expected));
    }
  }
}

}  // namespace kvscope::test
