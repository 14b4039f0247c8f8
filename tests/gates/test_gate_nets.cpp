// Each gate network against a reference written from its paper's equation
// in plain loops (random inputs, random parameters), and the official
// checkpoints against the official modules' outputs (fixtures written by
// tests/fixtures/gates/make_official.py with the official code's modules).
#include <cmath>

#include "capture/formats/safetensors.h"
#include "capture/gates/gate_nets.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"

using namespace kvscope;
using gates::GateKind;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double silu(double x) { return x * sigmoid(x); }

float value_at(const torch::Tensor& t, std::initializer_list<int64_t> idx) {
  torch::Tensor x = t;
  for (int64_t i : idx) x = x[i];
  return x.item<float>();
}

// WG-KV, seed 000 §3.2: x = [k; k_rope] (each RMS-normalised, as the official
// GatingPredictor with g_rms), g = sigma(W2 GELU(W1 x + b1) + b2), clamped at eps.
double wgkv_reference(const gates::GateSet& g, int64_t l, const torch::Tensor& pre, const torch::Tensor& post,
                      int64_t t, int64_t h) {
  const std::string p = "layers." + std::to_string(l) + ".self_attn.g_predictors.";
  const int64_t hd = pre.size(2);
  std::vector<double> x;
  for (auto [k, norm] : {std::pair{&pre, "pre_key_norm.weight"}, {&post, "post_key_norm.weight"}}) {
    double ms = 0;
    for (int64_t i = 0; i < hd; ++i) ms += std::pow(value_at(*k, {t, h, i}), 2);
    const double inv = 1.0 / std::sqrt(ms / double(hd) + 1e-6);
    for (int64_t i = 0; i < hd; ++i) x.push_back(value_at(*k, {t, h, i}) * inv * value_at(g.param(p + norm), {i}));
  }
  const torch::Tensor& w1 = g.param(p + "conv1.weight");  // [K*inner, 2hd, 1]
  const int64_t inner = w1.size(0) / pre.size(1);
  double s = value_at(g.param(p + "conv2.bias"), {h});
  for (int64_t j = 0; j < inner; ++j) {
    double a = value_at(g.param(p + "conv1.bias"), {h * inner + j});
    for (int64_t i = 0; i < 2 * hd; ++i) a += value_at(w1, {h * inner + j, i, 0}) * x[size_t(i)];
    s += value_at(g.param(p + "conv2.weight"), {h, j, 0}) * gelu(a);
  }
  return std::max(sigmoid(s), 1e-3);
}

// Attention-Gate, seed 001 Eq. 1-3: s = [H'_1(X), ..., H'_h'(X)] W_O', each
// H'_a = softmax(X Wq_a (X Wk_a)^T / sqrt(d')) X Wv_a over all tokens.
double ag_reference(const gates::GateSet& g, int64_t l, const torch::Tensor& X, int64_t t, int64_t h) {
  const std::string p = "layers." + std::to_string(l) + ".attention_gate.";
  const int64_t heads = int64_t(g.hyper("heads")), d = int64_t(g.hyper("head_dim"));
  const int64_t n = X.size(0), D = X.size(1);
  auto proj = [&](const char* m, int64_t row, int64_t out) {
    double a = 0;
    for (int64_t i = 0; i < D; ++i) a += value_at(g.param(p + m + ".weight"), {out, i}) * value_at(X, {row, i});
    return a;
  };
  double s = 0;
  for (int64_t a = 0; a < heads; ++a) {
    std::vector<double> w(static_cast<size_t>(n));
    double mx = -1e300;
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += proj("q_proj", t, a * d + c) * proj("k_proj", j, a * d + c);
      w[size_t(j)] = dot / std::sqrt(double(d));
      mx = std::max(mx, w[size_t(j)]);
    }
    double z = 0;
    for (double& v : w) z += (v = std::exp(v - mx));
    for (int64_t c = 0; c < d; ++c) {
      double o = 0;
      for (int64_t j = 0; j < n; ++j) o += w[size_t(j)] / z * proj("v_proj", j, a * d + c);
      s += value_at(g.param(p + "o_proj.weight"), {h, a * d + c}) * o;
    }
  }
  return s;
}

// TrimKV retention gate: log beta = log sigma(W2 act(W1 x + b1) + b); the
// global variant (seed 002 §4.1) uses head h's own W1 rows and the shared w, b.
double retention_reference(const gates::GateSet& g, int64_t l, const torch::Tensor& X, int64_t t, int64_t h) {
  const std::string p = "layers." + std::to_string(l) + ".self_attn.retention_gate.";
  const int64_t D = X.size(1), I = int64_t(g.hyper("hidden"));
  const bool global = g.kind == GateKind::RetentionGlobal;
  double s = global ? value_at(g.param("retention_gate_shared.bias"), {0}) : value_at(g.param(p + "bias"), {h});
  const int64_t rows = global ? I : I;
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t r = global ? h * I + j : j;
    double a = value_at(g.param(p + "linear1.bias"), {r});
    for (int64_t i = 0; i < D; ++i) a += value_at(g.param(p + "linear1.weight"), {r, i}) * value_at(X, {t, i});
    const double w = global ? value_at(g.param("retention_gate_shared.linear2.weight"), {0, j})
                            : value_at(g.param(p + "linear2.weight"), {h, j});
    s += w * silu(a);
  }
  return std::log(sigmoid(s));
}

}  // namespace

TEST_CASE("wgkv gate matches sigma(W2 GELU(W1 [RMSNorm(k), RMSNorm(k_rope)] + b1) + b2)", "[gates][nets]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 32);
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(GateKind::WriteGate,
                                         gates::resolve_hyperparameters(GateKind::WriteGate, shape, {}, ""), shape, 1);
  test::randomize(set, 7);
  for (int64_t l = 0; l < 2; ++l) {
    model::AttentionInputs in = test::gate_inputs(c, l, 0, 5, 3);
    torch::Tensor g = gates::wgkv_gate(set, l, in.k_pre_rope, in.k);
    REQUIRE(g.sizes() == torch::IntArrayRef({2, 5}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 5; ++t)
        CHECK(value_at(g, {h, t}) == Approx(wgkv_reference(set, l, in.k_pre_rope, in.k, t, h)).epsilon(1e-5));
  }
}

TEST_CASE("attention-gate scores match MHA'(X) W_O' over the whole prompt", "[gates][nets]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 24);
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::AttentionGate,
      gates::resolve_hyperparameters(GateKind::AttentionGate, shape, {{"heads", 3}, {"head_dim", 4}}, ""), shape, 1);
  test::randomize(set, 9, 0.3);
  model::AttentionInputs in = test::gate_inputs(c, 1, 0, 6, 4);
  torch::Tensor s = gates::attention_gate_scores(set, 1, in.hidden);
  REQUIRE(s.sizes() == torch::IntArrayRef({2, 6}));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 6; ++t) CHECK(value_at(s, {h, t}) == Approx(ag_reference(set, 1, in.hidden, t, h)).margin(1e-5));
  // A flag of an early token depends on later tokens (the gate sees the whole prompt).
  torch::Tensor other = in.hidden.clone();
  other[5] += 1.0;
  CHECK((gates::attention_gate_scores(set, 1, other)[0][0] - s[0][0]).abs().item<float>() > 1e-6f);
}

TEST_CASE("retention gates match log sigma(W2 act(W1 x + b1) + b), per layer and weight-tied", "[gates][nets]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::gate_config(3, 4, 2, 8, 16);
  auto shape = gates::GateShape::of(c);
  for (GateKind kind : {GateKind::Retention, GateKind::RetentionGlobal}) {
    gates::GateSet set = gates::init_gates(kind, gates::resolve_hyperparameters(kind, shape, {{"hidden", 6}}, ""), shape, 2);
    test::randomize(set, 11);
    for (int64_t l = 0; l < 3; ++l) {
      model::AttentionInputs in = test::gate_inputs(c, l, 0, 4, 5);
      torch::Tensor lb = gates::retention_log_beta(set, l, in.hidden);
      REQUIRE(lb.sizes() == torch::IntArrayRef({2, 4}));
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t t = 0; t < 4; ++t)
          CHECK(value_at(lb, {h, t}) == Approx(retention_reference(set, l, in.hidden, t, h)).margin(1e-5));
    }
    if (kind == GateKind::RetentionGlobal) {
      // The final projection is one tensor for every layer and head.
      CHECK(set.params.count("retention_gate_shared.linear2.weight") == 1);
      CHECK(set.params.count("layers.0.self_attn.retention_gate.linear2.weight") == 0);
    }
  }
}

TEST_CASE("initialisation follows the official code: beta ~ 1, WG-KV norms 1, Xavier for AG", "[gates][nets]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::gate_config(2, 4, 2, 8, 32);
  auto shape = gates::GateShape::of(c);
  gates::GateSet r = gates::init_gates(GateKind::Retention, gates::default_hyperparameters(GateKind::Retention, shape), shape, 3);
  model::AttentionInputs in = test::gate_inputs(c, 0, 0, 8, 1);
  CHECK(gates::retention_log_beta(r, 0, in.hidden).exp().min().item<float>() > 0.9999f);  // bias 10
  gates::GateSet w = gates::init_gates(GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 3);
  CHECK(w.param("layers.1.self_attn.g_predictors.pre_key_norm.weight").eq(1).all().item<bool>());
  const double bound = 1.0 / std::sqrt(16.0);  // conv1 fan-in 2*hd
  CHECK(w.param("layers.0.self_attn.g_predictors.conv1.weight").abs().max().item<double>() <= bound);
  // Same seed, same parameters; another seed, others.
  gates::GateSet w2 = gates::init_gates(GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 3);
  gates::GateSet w3 = gates::init_gates(GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 4);
  const std::string n = "layers.0.self_attn.g_predictors.conv1.weight";
  CHECK(torch::equal(w.param(n), w2.param(n)));
  CHECK_FALSE(torch::equal(w.param(n), w3.param(n)));
}

TEST_CASE("official WG-KV checkpoint (dict of nn.Parameter) gives the official module's g", "[gates][official]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::stories_shape();
  gates::GateSet set = gates::load_gates(test::gate_fixture("wgkv_official.pt"), c);
  CHECK(set.kind == GateKind::WriteGate);
  CHECK(set.hyper("expand") == 4.0);
  CHECK(set.hyper("window") == 256.0);  // official defaults (not in the file)
  CHECK(set.hyper("tau") == Approx(0.1));
  formats::SafetensorsFile expected(test::gate_fixture("expected.safetensors"));
  auto tensor = [&](const std::string& name) {
    const formats::StTensor* t = expected.find(name);
    REQUIRE(t);
    return torch::from_blob(const_cast<uint8_t*>(expected.data(*t)), t->shape, torch::kFloat32).clone();
  };
  for (int64_t l = 0; l < 5; ++l) {
    torch::Tensor g = gates::wgkv_gate(set, l, tensor("wgkv." + std::to_string(l) + ".k_pre"),
                                       tensor("wgkv." + std::to_string(l) + ".k_post"));
    CHECK(torch::allclose(g, tensor("wgkv." + std::to_string(l) + ".g"), 1e-5, 1e-6));
  }
}

TEST_CASE("official TrimKV checkpoint (bf16 OrderedDict + config.json) gives the official gate's log beta",
          "[gates][official]") {
  torch::NoGradGuard guard;
  model::ModelConfig c = test::stories_shape();
  formats::SafetensorsFile expected(test::gate_fixture("expected.safetensors"));
  auto tensor = [&](const std::string& name) {
    const formats::StTensor* t = expected.find(name);
    REQUIRE(t);
    return torch::from_blob(const_cast<uint8_t*>(expected.data(*t)), t->shape, torch::kFloat32).clone();
  };
  for (const std::string& path : {test::gate_fixture("trimkv"), test::gate_fixture("trimkv/trimkv_weights.pth")}) {
    gates::GateSet set = gates::load_gates(path, c);
    CHECK(set.kind == GateKind::Retention);
    CHECK(set.hyper("hidden") == 16.0);
    CHECK(set.meta["training"]["memory_size"] == 128);  // from config.json
    for (int64_t l = 0; l < 5; ++l) {
      torch::Tensor lb = gates::retention_log_beta(set, l, tensor("trimkv." + std::to_string(l) + ".hidden"));
      CHECK(torch::allclose(lb, tensor("trimkv." + std::to_string(l) + ".log_beta"), 1e-4, 1e-5));
    }
  }
}

TEST_CASE("an official checkpoint for another model is refused, naming what does not fit", "[gates][official]") {
  model::ModelConfig c = test::gate_config(5, 9, 3, 8, 64, "other");  // 3 kv heads, not 4
  try {
    gates::load_gates(test::gate_fixture("wgkv_official.pt"), c);
    FAIL("no error");
  } catch (const InputError& e) {
    const std::string m = e.what();
    CHECK(m.find("wgkv_official.pt") != std::string::npos);
    CHECK(m.find("conv1.weight has shape [128, 16, 1], the model needs [96, 16, 1]") != std::string::npos);
    CHECK(m.find("3 kv heads") != std::string::npos);
  }
  model::ModelConfig six = test::gate_config(6, 8, 4, 8, 64, "six");
  try {
    gates::load_gates(test::gate_fixture("trimkv"), six);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("the file has gates for 5 layers, the model has 6") != std::string::npos);
  }
}
