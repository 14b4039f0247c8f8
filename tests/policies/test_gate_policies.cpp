// The four learned policies on the ragged cache, on scripted sequences, each
// held to its definition: WG-KV's local ring of W plus the global cache of
// g >= tau tokens (prefill rejection, vertical-slash prefill mask, lazy
// promotion at decode, chunked prefill = one prefill); Attention-Gate's
// prefill flags (cache = flagged tokens, masked columns, decode appends);
// TrimKV's per-head top-M and DBTrimKV's global top-(L*K*M) of
// log(beta) * (t + 1 - position), checked against a direct simulation that
// uses the beta values the policies recorded in the trace.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "capture/cache/ragged_cache.h"
#include "capture/gates/gate_nets.h"
#include "capture/policy/registry.h"
#include "capture/attention/step_driver.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using gates::GateKind;

namespace {

const int64_t kMax = 96, kPage = 4;

// Drives a policy through the ragged cache with scripted inputs.
struct Run {
  model::ModelConfig c;
  policy::PolicyInstance pi;
  std::unique_ptr<policy::StepDriver> driver;
  const cache::RaggedKvCache* cache = nullptr;
  std::vector<trace::Event> events;
  std::vector<trace::GateValue> gate_values;
  std::function<void(model::AttentionInputs&)> script;
  Run(model::ModelConfig config, const std::string& spec, int64_t prompt) : c(std::move(config)) {
    pi = policy::make_policy(spec);
    pi.policy->setup({&c, kMax, prompt, kPage});
    driver = std::make_unique<policy::StepDriver>(
        c, policy::StepDriver::Options{kPage, kMax, prompt}, *pi.policy, "test");
    cache = &driver->cache();
  }
  model::AttentionInputs inputs(int64_t l, int64_t pos0, int64_t n) {
    model::AttentionInputs in = test::gate_inputs(c, l, pos0, n, 1);
    if (script) script(in);
    return in;
  }
  // One step; returns layer 0's attention output.
  torch::Tensor step(int64_t pos0, int64_t n) {
    torch::InferenceMode guard;
    driver->begin_step(pos0, n);
    torch::Tensor out0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      torch::Tensor o = driver->attend(inputs(l, pos0, n));
      if (l == 0) out0 = o;
    }
    driver->end_step();
    for (auto& e : driver->take_events()) events.push_back(e);
    for (auto& g : driver->take_gates()) gate_values.push_back(g);
    return out0;
  }
  std::set<int64_t> held(int64_t l, int64_t h, int tier) const {
    const auto& p = cache->positions(l, h, tier);
    return {p.begin(), p.end()};
  }
  int64_t count(trace::EventKind kind, uint16_t reason) const {
    return std::count_if(events.begin(), events.end(),
                         [&](auto& e) { return e.kind == kind && e.reason == reason; });
  }
};

// ---- WG-KV -------------------------------------------------------------------

// Token p is "important" at kv head h by this pattern; the gate built below
// gives g ~ 0.98 to important tokens and g ~ 0.02 to the others.
bool important(int64_t p, int64_t h) {
  return (p * 7 + h * 3) % 5 < 2;
}

std::string controllable_wgkv(const model::ModelConfig& c) {
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 1);
  torch::NoGradGuard g;
  const int64_t K = c.n_kv_heads, inner = 4 * c.head_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".self_attn.g_predictors.";
    set.params[p + "conv1.weight"].zero_();
    set.params[p + "conv1.bias"].zero_();
    set.params[p + "conv2.weight"].zero_();
    for (int64_t h = 0; h < K; ++h) {
      set.params[p + "conv1.weight"][h * inner][0][0] = 1.0;  // pre-RoPE key, component 0
      set.params[p + "conv2.weight"][h][0][0] = 2.0;
    }
    set.params[p + "conv2.bias"].fill_(-4.0);
  }
  return test::save_temp(set, "wgkv-scripted.safetensors");
}

void script_importance(model::AttentionInputs& in) {
  const int64_t n = in.k_pre_rope.size(0), K = in.k_pre_rope.size(1);
  in.k_pre_rope.zero_();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < K; ++h) in.k_pre_rope[i][h][0] = important(in.pos0 + i, h) ? 3.0 : -3.0;
}

// Keys a WG-KV query at qpos reads (vertical-slash, seed 000 §4.2).
std::vector<int64_t> wgkv_visible(int64_t qpos, int64_t h, int64_t W) {
  std::vector<int64_t> keys;
  for (int64_t j = 0; j <= qpos; ++j)
    if (qpos - j < W || important(j, h)) keys.push_back(j);
  return keys;
}

// Dense attention of query head `qh` at `qpos` over `keys`, from per-position
// scripted inputs (each position's q/k/v as its own step produced them).
torch::Tensor attention_over(Run& run,
                             const std::map<int64_t, std::pair<int64_t, int64_t>>& step_of,
                             int64_t qpos, int64_t qh, const std::vector<int64_t>& keys) {
  auto row = [&](int64_t p) {
    auto [pos0, n] = step_of.at(p);
    return std::pair{run.inputs(0, pos0, n), p - pos0};
  };
  const int64_t R = run.c.n_heads / run.c.n_kv_heads, kv = qh / R;
  auto [qin, qi] = row(qpos);
  torch::Tensor q = qin.q[qi][qh];
  std::vector<torch::Tensor> ks, vs;
  for (int64_t p : keys) {
    auto [in, i] = row(p);
    ks.push_back(in.k[i][kv]);
    vs.push_back(in.v[i][kv]);
  }
  torch::Tensor K = torch::stack(ks), V = torch::stack(vs);
  return torch::mv(V.t(), torch::softmax(torch::mv(K, q) * qin.scale, 0));
}

}  // namespace

TEST_CASE("wgkv: prefill keeps the last W local, admits g >= tau older tokens, rejects the rest",
          "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 16, 32);
  const int64_t W = 4, P = 14;
  Run run(c, "wgkv:gates=" + controllable_wgkv(c) + ",window=" + std::to_string(W) + ",tau=0.5", P);
  run.script = script_importance;
  torch::Tensor out = run.step(0, P);
  int64_t rejects = 0;
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 2; ++h) {
      std::set<int64_t> local, global;
      for (int64_t p = P - W; p < P; ++p) local.insert(p);
      for (int64_t p = 0; p < P - W; ++p)
        if (important(p, h))
          global.insert(p);
        else
          ++rejects;
      CHECK(run.held(l, h, 1) == local);
      CHECK(run.held(l, h, 0) == global);
    }
  CHECK(run.count(trace::EventKind::Reject, 2) == rejects);
  // The gate values are in the trace, one per (layer, head, token).
  CHECK(run.gate_values.size() == size_t(2 * 2 * P));
  // Prefill queries read the vertical-slash set: window + important tokens.
  std::map<int64_t, std::pair<int64_t, int64_t>> step_of;
  for (int64_t p = 0; p < P; ++p) step_of[p] = {0, P};
  for (int64_t q : {5, 9, 13})
    for (int64_t qh : {0, 3}) {
      torch::Tensor want = attention_over(run, step_of, q, qh, wgkv_visible(q, qh / 2, W));
      CHECK(torch::allclose(out[q][qh], want, 1e-5, 1e-5));
    }
}

TEST_CASE("wgkv: decode is a ring of W with lazy promotion of g >= tau tokens", "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 16, 32);
  const int64_t W = 4, P = 6;
  Run run(c, "wgkv:gates=" + controllable_wgkv(c) + ",window=" + std::to_string(W) + ",tau=0.5", P);
  run.script = script_importance;
  run.step(0, P);
  std::map<int64_t, std::pair<int64_t, int64_t>> step_of;
  for (int64_t p = 0; p < P; ++p) step_of[p] = {0, P};
  int64_t promoted = 0, dropped = 0;
  for (int64_t t = P; t < P + 20; ++t) {
    torch::Tensor out = run.step(t, 1);
    step_of[t] = {t, 1};
    const int64_t victim = t - W;
    for (int64_t h = 0; h < 2; ++h) (important(victim, h) ? promoted : dropped) += 2;  // two layers
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        std::set<int64_t> local, global;
        for (int64_t p = t + 1 - W; p <= t; ++p) local.insert(p);
        for (int64_t p = 0; p <= t - W; ++p)
          if (important(p, h)) global.insert(p);
        REQUIRE(run.held(l, h, 1) == local);
        REQUIRE(run.held(l, h, 0) == global);
      }
    if (t % 7 == 0)
      CHECK(torch::allclose(out[0][2], attention_over(run, step_of, t, 2, wgkv_visible(t, 1, W)),
                            1e-5, 1e-5));
  }
  CHECK(run.count(trace::EventKind::Promote, 1) == promoted);
  CHECK(run.count(trace::EventKind::Evict, 2) == dropped);
}

TEST_CASE(
    "wgkv: a prefill in chunks ends with the same cache and the same attention as one prefill",
    "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 16, 32);
  const int64_t W = 4, P = 17;
  const std::string spec =
      "wgkv:gates=" + controllable_wgkv(c) + ",window=" + std::to_string(W) + ",tau=0.5";
  Run chunked(c, spec, P);
  chunked.script = script_importance;
  std::map<int64_t, std::pair<int64_t, int64_t>> step_of;
  std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 6}, {6, 6}, {12, 5}};
  std::map<int64_t, torch::Tensor> outs;
  for (auto [pos0, n] : chunks) {
    torch::Tensor o = chunked.step(pos0, n);
    for (int64_t i = 0; i < n; ++i) {
      step_of[pos0 + i] = {pos0, n};
      outs[pos0 + i] = o[i];
    }
  }
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 2; ++h) {
      std::set<int64_t> local, global;
      for (int64_t p = P - W; p < P; ++p) local.insert(p);
      for (int64_t p = 0; p < P - W; ++p)
        if (important(p, h)) global.insert(p);
      CHECK(chunked.held(l, h, 1) == local);
      CHECK(chunked.held(l, h, 0) == global);
    }
  // Queries of later chunks see the earlier chunks through the same mask.
  for (int64_t q : {7, 11, 14, 16})
    CHECK(torch::allclose(outs[q][1], attention_over(chunked, step_of, q, 1, wgkv_visible(q, 0, W)),
                          1e-5, 1e-5));
}

// ---- Attention-Gate ----------------------------------------------------------------

TEST_CASE(
    "attention_gate: the prompt's flag-1 tokens are cached, flag-0 columns masked, decode appends",
    "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 24);
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::AttentionGate,
      gates::resolve_hyperparameters(GateKind::AttentionGate, shape,
                                     {{"heads", 2}, {"head_dim", 4}, {"gamma", 0.0}}, ""),
      shape, 3);
  test::randomize(set, 4, 0.6);
  const std::string path = test::save_temp(set, "ag.safetensors");
  const int64_t P = 12;
  Run run(c, "attention_gate:gates=" + path, P);
  torch::Tensor out = run.step(0, P);
  std::map<int64_t, std::pair<int64_t, int64_t>> step_of;
  for (int64_t p = 0; p < P; ++p) step_of[p] = {0, P};
  int64_t flagged_total = 0;
  for (int64_t l = 0; l < 2; ++l) {
    torch::Tensor prob =
        torch::sigmoid(gates::attention_gate_scores(set, l, run.inputs(l, 0, P).hidden));
    for (int64_t h = 0; h < 2; ++h) {
      std::set<int64_t> keep;
      for (int64_t p = 0; p < P; ++p)
        if (prob[h][p].item<float>() > 0.5f) keep.insert(p);
      flagged_total += int64_t(keep.size());
      CHECK(run.held(l, h, 0) == keep);
      if (l == 0)
        for (int64_t q : {4, 8, 11}) {
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < q; ++j)
            if (keep.count(j)) keys.push_back(j);
          keys.push_back(q);  // the diagonal
          CHECK(torch::allclose(out[q][2 * h], attention_over(run, step_of, q, 2 * h, keys), 1e-5,
                                1e-5));
        }
    }
  }
  CHECK(flagged_total > 0);
  CHECK(flagged_total < 2 * 2 * P);  // both decisions occur
  CHECK(run.count(trace::EventKind::Reject, 1) == 2 * 2 * P - flagged_total);
  const int64_t before = run.cache->entries();
  for (int64_t t = P; t < P + 5; ++t) run.step(t, 1);
  CHECK(run.cache->entries() == before + 5 * 2 * 2);  // decoding appends, evicts nothing
  // A prompt prefilled in chunks is refused: the flags need the whole prompt.
  Run chunked(c, "attention_gate:gates=" + path, P);
  CHECK_THROWS_AS(chunked.step(0, 6), InputError);
}

// ---- TrimKV / DBTrimKV -----------------------------------------------------------------

namespace {

// Retention gates where beta of token p at head h is sigma(w_h silu(a_p)),
// a_p = the hidden state's first component (scripted): per-head w differ so
// heads rank the same tokens differently.
std::string controllable_retention(const model::ModelConfig& c) {
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::Retention,
      gates::resolve_hyperparameters(GateKind::Retention, shape, {{"hidden", 1}}, ""), shape, 1);
  torch::NoGradGuard g;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".self_attn.retention_gate.";
    set.params[p + "linear1.weight"].zero_();
    set.params[p + "linear1.weight"][0][0] = 1.0;
    set.params[p + "linear1.bias"].zero_();
    for (int64_t h = 0; h < c.n_kv_heads; ++h)
      set.params[p + "linear2.weight"][h][0] = 0.6 + 0.5 * double(h + l);
    set.params[p + "bias"].fill_(0.5);
  }
  return test::save_temp(set, "retention-scripted.safetensors");
}

void script_retention(model::AttentionInputs& in) {
  for (int64_t i = 0; i < in.hidden.size(0); ++i) {
    const int64_t p = in.pos0 + i;
    in.hidden[i][0] = double((p * 37 + 11) % 23) / 4.0;  // 0 .. 5.5
  }
}

// beta of every (layer, head, position) as recorded in the trace.
std::map<std::tuple<int64_t, int64_t, int64_t>, double> recorded_beta(const Run& run) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, double> b;
  for (const auto& g : run.gate_values) b[{g.layer, g.kv_head, g.token}] = g.value;
  return b;
}

}  // namespace

TEST_CASE("trimkv: each head keeps its top-M of log(beta) * (t + 1 - pos) once it holds M + buffer",
          "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 16);
  const int64_t M = 5, buffer = 2, P = 4;
  Run run(c,
          "trimkv:gates=" + controllable_retention(c) + ",budget=" + std::to_string(M) +
              ",buffer=" + std::to_string(buffer),
          P);
  run.script = script_retention;
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> sim;  // the definition, step by step
  int64_t evictions = 0;
  auto advance = [&](int64_t pos0, int64_t n) {
    run.step(pos0, n);
    auto beta = recorded_beta(run);
    const int64_t fed = pos0 + n;
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) {
        std::set<int64_t>& s = sim[{l, h}];
        for (int64_t p = pos0; p < fed; ++p) s.insert(p);
        if (int64_t(s.size()) >= M + buffer) {
          std::vector<std::pair<double, int64_t>> v;
          for (int64_t p : s) v.push_back({std::log(beta.at({l, h, p})) * double(fed + 1 - p), p});
          std::sort(v.begin(), v.end(), [](auto& a, auto& b) {
            return a.first != b.first ? a.first > b.first : a.second > b.second;
          });
          s.clear();
          for (int64_t k = 0; k < M; ++k) s.insert(v[size_t(k)].second);
          evictions += int64_t(v.size()) - M;
        }
        REQUIRE(run.held(l, h, 0) == s);
      }
  };
  advance(0, P);
  for (int64_t t = P; t < P + 30; ++t) advance(t, 1);
  CHECK(run.count(trace::EventKind::Evict, 1) == evictions);
  CHECK(evictions > 0);
  // Heads differ in what they keep (per-head w): ragged content, equal counts.
  CHECK(run.held(0, 0, 0) != run.held(0, 1, 0));
}

TEST_CASE("dbtrimkv: one global top-(L*K*M) across layers and heads, unequal per-head budgets",
          "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 16);
  const int64_t M = 4, buffer = 1, P = 3;
  for (int64_t min_per_head : {0, 2}) {
    Run run(c,
            "dbtrimkv:gates=" + controllable_retention(c) + ",budget=" + std::to_string(M) +
                ",buffer=" + std::to_string(buffer) + ",min=" + std::to_string(min_per_head),
            P);
    run.script = script_retention;
    CHECK(run.pi.policy->budget() == 2 * 2 * M);
    std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> sim;
    bool unequal = false;
    auto advance = [&](int64_t pos0, int64_t n) {
      run.step(pos0, n);
      auto beta = recorded_beta(run);
      const int64_t fed = pos0 + n;
      int64_t total = 0;
      for (auto& [k, s] : sim) total += int64_t(s.size());
      total += 2 * 2 * n;
      for (int64_t l = 0; l < 2; ++l)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t p = pos0; p < fed; ++p) sim[{l, h}].insert(p);
      if (total >= 2 * 2 * (M + buffer)) {
        struct E {
          double s;
          int64_t l, h, p;
        };
        std::vector<E> all;
        std::map<std::pair<int64_t, int64_t>, std::vector<E>> per;
        for (auto& [k, s] : sim)
          for (int64_t p : s) {
            E e{std::log(beta.at({k.first, k.second, p})) * double(fed + 1 - p), k.first, k.second,
                p};
            all.push_back(e);
            per[k].push_back(e);
          }
        auto better = [](const E& a, const E& b) {
          if (a.s != b.s) return a.s > b.s;
          if (a.p != b.p) return a.p > b.p;
          return a.l != b.l ? a.l < b.l : a.h < b.h;
        };
        std::sort(all.begin(), all.end(), better);
        std::map<std::pair<int64_t, int64_t>, int64_t> keep;
        const int64_t ranked = 2 * 2 * (M - min_per_head);
        for (int64_t k = 0; k < std::min<int64_t>(ranked, int64_t(all.size())); ++k)
          ++keep[{all[size_t(k)].l, all[size_t(k)].h}];
        for (auto& [k, v] : per) {
          std::sort(v.begin(), v.end(), better);
          sim[k].clear();
          for (int64_t i = 0; i < std::min<int64_t>(keep[k] + min_per_head, int64_t(v.size())); ++i)
            sim[k].insert(v[size_t(i)].p);
        }
      }
      std::set<size_t> sizes;
      for (int64_t l = 0; l < 2; ++l)
        for (int64_t h = 0; h < 2; ++h) {
          REQUIRE(run.held(l, h, 0) == sim[{l, h}]);
          sizes.insert(sim[{l, h}].size());
          CHECK(int64_t(sim[{l, h}].size()) >= std::min<int64_t>(min_per_head, fed));
        }
      unequal |= sizes.size() > 1;
      if (total >= 2 * 2 * (M + buffer)) CHECK(run.cache->entries() == 2 * 2 * M);
    };
    advance(0, P);
    for (int64_t t = P; t < P + 25; ++t) advance(t, 1);
    CHECK(unequal);
  }
}

TEST_CASE("learned policies refuse a missing or wrong-kind gate file, naming it",
          "[gates][policy]") {
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 16);
  CHECK_THROWS_AS(policy::make_policy("wgkv"), InputError);  // gates= is required
  const std::string retention = controllable_retention(c);
  try {
    Run run(c, "wgkv:gates=" + retention, 4);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("this file holds retention gates") != std::string::npos);
  }
  CHECK_THROWS_AS(Run(c, "trimkv:gates=" + test::temp_dir() + "/none.safetensors", 4), InputError);
}
