// The KVpop policy (seed 003) on scripted sequences: sinks, window and
// long-range top-k held to a direct simulation from the scores the policy
// recorded, the prefill mask (the last prompt query attends exactly the
// simulated set), the cutoff series, and the bad inputs of the spec. The
// scorers: tests/gates/test_kvpop_scorers.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "capture/attention/step_driver.h"
#include "capture/gates/kvpop_scorer.h"
#include "capture/policy/registry.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"

using namespace kvscope;
using gates::GateKind;
using test::kvpop_set;

namespace {

const int64_t kMax = 96, kPage = 4, kSinks = 2, kWindow = 4, kTopk = 6;

// Inputs of positions pos0..pos0+n-1, each drawn for its own position, so a
// chunked prefill feeds exactly what one prefill feeds.
model::AttentionInputs positional_inputs(const model::ModelConfig& c, int64_t l, int64_t pos0,
                                         int64_t n) {
  std::vector<model::AttentionInputs> rows;
  for (int64_t p = pos0; p < pos0 + n; ++p) rows.push_back(test::gate_inputs(c, l, p, 1, 1));
  model::AttentionInputs in = rows[0];
  in.pos0 = pos0;
  auto cat = [&](torch::Tensor model::AttentionInputs::*f) {
    std::vector<torch::Tensor> parts;
    for (auto& r : rows) parts.push_back(r.*f);
    in.*f = torch::cat(parts, 0);
  };
  for (auto f : {&model::AttentionInputs::hidden, &model::AttentionInputs::q,
                 &model::AttentionInputs::k_pre_rope, &model::AttentionInputs::k,
                 &model::AttentionInputs::v})
    cat(f);
  return in;
}

struct KvpopRun {
  model::ModelConfig c = test::stories_shape();
  std::string path;
  policy::PolicyInstance pi;
  std::unique_ptr<policy::StepDriver> driver;
  std::map<std::tuple<int64_t, int64_t, int64_t>, float> raw;  // (layer, head, pos) -> r
  std::vector<trace::Event> events;
  std::vector<std::vector<float>> series;  // per step
  std::vector<torch::Tensor> out0;         // layer 0's output per step
  KvpopRun(GateKind kind, const std::string& extra = "", bool fresh = false) {
    const gates::GateShape shape = gates::GateShape::of(c);
    const nlohmann::json hyper = {{"sinks", kSinks}, {"window", kWindow}, {"topk", kTopk}};
    gates::GateSet set =
        fresh ? gates::init_gates(kind, gates::resolve_hyperparameters(kind, shape, hyper, ""),
                                  shape, 11)
              : kvpop_set(kind, c, hyper, 11);
    path =
        test::save_temp(set, std::string("kvpop-") + gates::gate_kind_name(kind) + ".safetensors");
    pi = policy::make_policy("kvpop:gates=" + path + extra);
    pi.policy->setup({&c, kMax, 30, kPage});
    driver = std::make_unique<policy::StepDriver>(c, policy::StepDriver::Options{kPage, kMax, 30},
                                                  *pi.policy, "test");
  }
  void step(int64_t pos0, int64_t n) {
    torch::InferenceMode guard;
    driver->begin_step(pos0, n);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      torch::Tensor o = driver->attend(positional_inputs(c, l, pos0, n));
      if (l == 0) out0.push_back(o);
    }
    driver->end_step();
    for (auto& e : driver->take_events()) events.push_back(e);
    for (auto& g : driver->take_gates()) raw[{g.layer, g.kv_head, g.token}] = g.value;
    series.push_back(driver->take_series());
  }
  double log_gamma(int64_t l, int64_t h) const {
    gates::GateSet g = gates::load_gates(path, c);
    return gates::kvpop_log_gamma(g, l)[h].item<double>();
  }
  std::set<int64_t> held(int64_t l, int64_t h, int tier) const {
    const auto& p = driver->cache().positions(l, h, tier);
    return {p.begin(), p.end()};
  }
  // The long-range top-k at query q by a direct sort of E(q) on r - t log gamma.
  std::set<int64_t> top_k(int64_t l, int64_t h, int64_t q, float* cutoff = nullptr) const {
    const double lg = log_gamma(l, h);
    std::vector<std::pair<double, int64_t>> e;
    for (int64_t t = kSinks; t <= q - kWindow; ++t)
      e.push_back({double(raw.at({l, h, t})) + double(q - t) * lg, t});
    std::sort(e.begin(), e.end(), [](auto& a, auto& b) {
      return a.first != b.first ? a.first > b.first : a.second > b.second;
    });
    std::set<int64_t> out;
    for (size_t i = 0; i < e.size() && int64_t(i) < kTopk; ++i) out.insert(e[i].second);
    if (cutoff) *cutoff = int64_t(e.size()) > kTopk ? float(e[size_t(kTopk - 1)].first) : NAN;
    return out;
  }
};

// Layer 0, query head 0: softmax attention of query q over `keys`, the
// position's inputs re-created.
torch::Tensor attention_over(const model::ModelConfig& c, int64_t q,
                             const std::set<int64_t>& keys) {
  model::AttentionInputs qin = test::gate_inputs(c, 0, q, 1, 1);
  std::vector<torch::Tensor> ks, vs;
  for (int64_t p : keys) {
    model::AttentionInputs in = test::gate_inputs(c, 0, p, 1, 1);
    ks.push_back(in.k[0][0]);
    vs.push_back(in.v[0][0]);
  }
  torch::Tensor K = torch::stack(ks), V = torch::stack(vs);
  return torch::mv(V.t(), torch::softmax(torch::mv(K, qin.q[0][0]) * qin.scale, 0));
}

std::set<int64_t> expected_keys(const KvpopRun& r, int64_t q) {
  std::set<int64_t> keys = r.top_k(0, 0, q);
  for (int64_t t = 0; t <= q; ++t)
    if (t < kSinks || q - t < kWindow) keys.insert(t);
  return keys;
}

}  // namespace

TEST_CASE(
    "kvpop holds sinks, window and the long-range top-k, prefill queries attend the running top-k",
    "[kvpop][policy]") {
  for (GateKind kind : {GateKind::KvpopMlp, GateKind::KvpopMlstm}) {
    INFO(gates::gate_kind_name(kind));
    KvpopRun r(kind);
    r.step(0, 30);
    for (int64_t p = 30; p < 50; ++p) r.step(p, 1);
    // The prefill mask: queries 12 and 29 see exactly sinks + window + their top-k.
    for (int64_t q : {12, 29})
      CHECK(torch::allclose(r.out0[0][q][0], attention_over(r.c, q, expected_keys(r, q)), 1e-4,
                            1e-5));
    // The scores the policy recorded, token by token across prefill and
    // decode, are the scorer's over the whole sequence: the delayed mLSTM
    // readout at inference is the training-time parallel form.
    {
      gates::GateSet g = gates::load_gates(r.path, r.c);
      for (int64_t l = 0; l < r.c.n_layers; ++l) {
        model::AttentionInputs in = positional_inputs(r.c, l, 0, 50);
        torch::Tensor x = gates::kvpop_inputs(in.k, in.v);
        torch::Tensor want = kind == GateKind::KvpopMlp
                                 ? gates::kvpop_mlp_scores(g, l, x)
                                 : gates::mlstm_scores_parallel(g, l, x, kWindow);
        for (int64_t h = 0; h < r.c.n_kv_heads; ++h)
          for (int64_t t = 0; t <= 49 - kWindow; ++t)
            CHECK(r.raw.at({l, h, t}) ==
                  Approx(want[h][t].item<float>()).epsilon(1e-4).margin(1e-5));
      }
    }
    // A decode query sees the same (the leaver against the long-range set).
    CHECK(torch::allclose(r.out0.back()[0][0], attention_over(r.c, 49, expected_keys(r, 49)), 1e-4,
                          1e-5));
    for (int64_t l = 0; l < r.c.n_layers; ++l)
      for (int64_t h = 0; h < r.c.n_kv_heads; ++h) {
        INFO("layer " << l << " head " << h);
        CHECK(r.held(l, h, 0) == std::set<int64_t>{0, 1});
        CHECK(r.held(l, h, 1) == std::set<int64_t>{46, 47, 48, 49});
        float cutoff = NAN;
        CHECK(r.held(l, h, 2) == r.top_k(l, h, 49, &cutoff));
        const std::vector<float>& s = r.series.back();
        REQUIRE(s.size() == size_t(r.c.n_layers * r.c.n_kv_heads));
        CHECK(s[size_t(l * r.c.n_kv_heads + h)] == Approx(cutoff).epsilon(1e-5));
      }
    // Every eviction is a boundary decision: a leaver below the cutoff, or a
    // long-range entry that fell below it; the kept leavers moved there.
    int64_t dropped = 0, displaced = 0, kept = 0;
    for (const trace::Event& e : r.events) {
      if (e.kind == trace::EventKind::Evict) {
        CHECK((e.reason == 3 || e.reason == 4));
        CHECK(int(e.from_tier) == (e.reason == 3 ? 1 : 2));
        (e.reason == 3 ? dropped : displaced)++;
      }
      if (e.kind == trace::EventKind::Demote) kept += e.reason == 2;
    }
    // 50 tokens, 2 sinks and 4 in the window: 44 left the window; 6 remain.
    CHECK(dropped + displaced ==
          44 * r.c.n_layers * r.c.n_kv_heads - kTopk * r.c.n_layers * r.c.n_kv_heads);
    CHECK(kept + dropped == 44 * r.c.n_layers * r.c.n_kv_heads);
    CHECK(displaced > 0);
  }
}

TEST_CASE("kvpop with an untrained scorer is StreamingLLM: sinks + the last w + k tokens",
          "[kvpop][policy]") {
  // A fresh scorer gives every token the same score (the score projection
  // starts at zero, E.5), so the decay alone ranks: the newest eligible win.
  for (GateKind kind : {GateKind::KvpopMlp, GateKind::KvpopMlstm}) {
    INFO(gates::gate_kind_name(kind));
    KvpopRun r(kind, "", true);
    r.step(0, 30);
    for (int64_t p = 30; p < 45; ++p) {
      r.step(p, 1);
      for (int64_t l = 0; l < r.c.n_layers; ++l)
        for (int64_t h = 0; h < r.c.n_kv_heads; ++h) {
          std::set<int64_t> held = r.held(l, h, 0), win = r.held(l, h, 1), lr = r.held(l, h, 2),
                            want;
          held.insert(win.begin(), win.end());
          held.insert(lr.begin(), lr.end());
          for (int64_t t = 0; t <= p; ++t)
            if (t < kSinks || p - t < kWindow + kTopk) want.insert(t);
          CHECK(held == want);
        }
    }
  }
}

TEST_CASE("kvpop: a chunked prefill holds what one prefill holds", "[kvpop][policy]") {
  for (GateKind kind : {GateKind::KvpopMlp, GateKind::KvpopMlstm}) {
    INFO(gates::gate_kind_name(kind));
    KvpopRun one(kind), chunked(kind);
    one.step(0, 30);
    chunked.step(0, 7), chunked.step(7, 11), chunked.step(18, 12);
    for (int64_t p = 30; p < 40; ++p) one.step(p, 1), chunked.step(p, 1);
    for (int64_t l = 0; l < one.c.n_layers; ++l)
      for (int64_t h = 0; h < one.c.n_kv_heads; ++h)
        for (int tier : {0, 1, 2}) CHECK(one.held(l, h, tier) == chunked.held(l, h, tier));
    CHECK(torch::allclose(one.out0.back(), chunked.out0.back(), 1e-5, 1e-6));
  }
}

TEST_CASE("kvpop refuses a scorer of another kind or model and a budget past the context",
          "[kvpop][policy]") {
  const model::ModelConfig c = test::stories_shape();
  auto field_of = [&](const std::string& spec, const model::ModelConfig& m) {
    try {
      policy::PolicyInstance pi = policy::make_policy(spec);
      pi.policy->setup({&m, kMax, 30, kPage});
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet mlstm =
      gates::init_gates(GateKind::KvpopMlstm,
                        gates::resolve_hyperparameters(GateKind::KvpopMlstm, shape,
                                                       {{"window", 8}, {"topk", 20}}, ""),
                        shape, 1);
  const std::string path = test::save_temp(mlstm, "kvpop-bad.safetensors");
  CHECK(field_of("kvpop:gates=" + path, c) == "accepted");
  CHECK(field_of("kvpop:kind=mlp,gates=" + path, c) == "policy");
  CHECK(field_of("kvpop:topk=200,gates=" + path, c) == "kvpop:topk");
  CHECK(field_of("kvpop:budget=10,gates=" + path, c) == "kvpop:budget");
  CHECK(field_of("kvpop:budget=40,compression=0.5,gates=" + path, c) == "kvpop:budget");
  CHECK(field_of("kvpop:kind=lstm,gates=" + path, c) == "kvpop:kind");
  CHECK(field_of("kvpop:gates=" + path, test::gate_config(5, 8, 4, 16, 64)) == "shape");
  mlstm.meta["base_model"] = {{"name", "SmolLM2-135M-Instruct"}};
  const std::string other = test::save_temp(mlstm, "kvpop-other.safetensors");
  CHECK(field_of("kvpop:gates=" + other, c) == "base_model.name");
  gates::GateSet wgkv = gates::init_gates(
      GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 1);
  CHECK(field_of("kvpop:gates=" + test::save_temp(wgkv, "wgkv-not-kvpop.safetensors"), c) ==
        "policy");
}
