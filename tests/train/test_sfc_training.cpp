// Training the Latent Salience Forecaster (seed 004; docs/policies/sfc.md,
// "Training"): the batched LibTorch forecaster equals the capture-time one
// (SfcForecaster) on random inputs, the GRU cell equals a hand computation,
// labels and onsets of a hand-made received matrix, the asymmetric loss
// weighs a missed positive alpha times a false positive, the loss falls on a
// stories260K trace captured here, and bad traces are refused naming file
// and field.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "capture/generate/engine.h"
#include "capture/model/model_loader.h"
#include "capture/train/sfc_data.h"
#include "capture/train/sfc_training.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using gates::GateKind;

namespace {

gates::GateSet sfc_set(const model::ModelConfig& c, const nlohmann::json& given, uint64_t seed) {
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::SfcGru, gates::resolve_hyperparameters(GateKind::SfcGru, shape, given, ""), shape,
      seed);
  set.source = "test";
  return set;
}

// A sequence of random keys, queries and EWMAs: a prefill of two chunks
// (3 + 2 tokens), then one token a step.
gates::SfcSequence random_sequence(const model::ModelConfig& c, int64_t decode, uint64_t seed) {
  torch::manual_seed(seed);
  gates::SfcSequence s;
  s.first = {0, 3};
  for (int64_t i = 0; i < decode; ++i) s.first.push_back(5 + i);
  s.S = int64_t(s.first.size());
  s.T = s.first.back() + 1;
  for (int64_t t = 0; t < s.S; ++t) {
    const int64_t end = t + 1 < s.S ? s.first[size_t(t + 1)] : s.T;
    for (int64_t j = s.first[size_t(t)]; j < end; ++j) s.fed_at.push_back(t);
  }
  s.NG = c.n_layers * c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.keys = torch::randn({s.NG, s.T, c.head_dim});
  s.qmean = torch::randn({s.NG, s.S, c.head_dim});
  s.ewma = torch::rand({s.S, s.NG, s.T}) * 0.3;
  s.y_now = (torch::rand({s.S, s.NG, s.T}) < 0.3).to(torch::kUInt8);
  s.tau = torch::zeros({s.S, s.NG});
  return s;
}

std::vector<float> row(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The capture-time forecaster over the same inputs, token by token, against
// the batched forward of `groups` x `tokens`.
void check_against_forecaster(const gates::GateSet& set, const gates::SfcSequence& s,
                              const std::vector<int64_t>& groups,
                              const std::vector<int64_t>& tokens) {
  const gates::SfcForecaster net(set);
  const gates::SfcConfig& c = net.config();
  const int64_t K = net.n_kv_heads(), G = c.hidden, Z = c.latent;
  const gates::SfcForward f =
      gates::sfc_forward(gates::SfcParams::of(set), c, s, torch::tensor(groups, torch::kInt64),
                         torch::tensor(tokens, torch::kInt64));
  REQUIRE(f.logits.size(0) == int64_t(groups.size()));
  REQUIRE(f.logits.size(1) == s.S - f.t0);
  REQUIRE(f.logits.size(2) == int64_t(tokens.size()));
  auto logits = f.logits.accessor<float, 4>();
  auto active = f.active.accessor<bool, 2>();
  int64_t compared = 0;
  double worst = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int64_t g = groups[gi], layer = g / K, head = g % K;
    for (size_t ti = 0; ti < tokens.size(); ++ti) {
      const int64_t j = tokens[ti];
      const std::vector<float> key = row(s.keys[g][j]);
      float norm = 0;
      for (float v : key) norm += v * v;
      norm = std::sqrt(norm);
      std::vector<float> zk(static_cast<size_t>(Z)), zq(static_cast<size_t>(Z));
      std::vector<float> x(static_cast<size_t>(c.features())), h(static_cast<size_t>(G), 0.0f);
      net.latent(layer, head, key.data(), zk.data());
      for (int64_t t = f.t0; t < s.S; ++t) {
        const bool on = t > s.fed_at[size_t(j)];
        REQUIRE(active[t - f.t0][int64_t(ti)] == on);
        if (!on) continue;
        const std::vector<float> q = row(s.qmean[g][t]);
        net.latent(layer, head, q.data(), zq.data());
        gates::sfc_features(c, s.ewma[t][g][j].item<float>(), s.first[size_t(t)],
                            s.first[size_t(t)] - j, norm, zq.data(), zk.data(), x.data());
        float out[2];
        net.step(layer, head, x.data(), h.data(), out);
        for (int o = 0; o < 2; ++o) {
          const double d =
              std::fabs(double(out[o]) - logits[int64_t(gi)][t - f.t0][int64_t(ti)][o]);
          worst = std::max(worst, d);
          ++compared;
        }
      }
    }
  }
  INFO("largest difference " << worst << " over " << compared << " logits");
  CHECK(compared > 0);
  CHECK(worst < 1e-5);
}

}  // namespace

TEST_CASE("sfc: the batched forecaster equals SfcForecaster on random inputs",
          "[gates][sfc][sfc_train]") {
  const model::ModelConfig c = test::gate_config(2, 4, 2, 16, 32, "synthetic");
  gates::GateSet set = sfc_set(c, {{"hidden", 6}, {"latent", 5}}, 11);
  test::randomize(set, 12, 0.4);
  const gates::SfcSequence s = random_sequence(c, 7, 13);
  SECTION("every group and token with a forecast") {
    std::vector<int64_t> tokens;
    for (int64_t j = 0; j < s.T && s.fed_at[size_t(j)] + 1 < s.S; ++j) tokens.push_back(j);
    check_against_forecaster(set, s, {0, 1, 2, 3}, tokens);
  }
  SECTION("a sample of groups and late tokens (t0 > 1)") {
    check_against_forecaster(set, s, {1, 3}, {5, 7, 9});
  }
  SECTION("the training parametrisation writes the parameters it trains") {
    // Standardised coordinates (SfcTrainable): the effective parameters it
    // computes are the ones the gate file gets, and the GRU's input gates see
    // standardised features at the start.
    const gates::SfcTrainable tr(set, {s}, 64);  // every token: the moments of all of them
    gates::GateSet written = set;
    tr.write_to(written);
    const torch::Tensor g = torch::arange(4, torch::kInt64), t = torch::arange(11, torch::kInt64);
    const gates::SfcConfig cfg = gates::SfcConfig::of(set);
    torch::NoGradGuard no_grad;
    CHECK(torch::allclose(gates::sfc_forward(tr.params(), cfg, s, g, t).logits,
                          gates::sfc_forward(gates::SfcParams::of(written), cfg, s, g, t).logits,
                          1e-5, 1e-6));
    check_against_forecaster(written, s, {0, 1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7});
    const gates::SfcForward f = gates::sfc_forward(tr.params(), cfg, s, g, t);
    const torch::Tensor x = f.features.masked_select(f.active.unsqueeze(0).unsqueeze(-1))
                                .view({4, -1, cfg.features()});  // [groups, entries, F]
    const torch::Tensor z = (x - tr.mu.unsqueeze(1)) / tr.sigma.unsqueeze(1);
    CHECK(z.mean(1).abs().max().item<double>() < 1e-4);
    CHECK((z.pow(2).mean(1) - 1).abs().max().item<double>() < 1e-3);
  }
  SECTION("truncated backpropagation leaves the forward unchanged") {
    const torch::Tensor g = torch::arange(4, torch::kInt64), t = torch::arange(6, torch::kInt64);
    const gates::SfcParams p = gates::SfcParams::of(set);
    const gates::SfcConfig cfg = gates::SfcConfig::of(set);
    CHECK(torch::equal(gates::sfc_forward(p, cfg, s, g, t, 0).logits,
                       gates::sfc_forward(p, cfg, s, g, t, 3).logits));
  }
}

TEST_CASE("sfc: one GRU step against a hand computation (G = 2, F = 12)",
          "[gates][sfc][sfc_train]") {
  // One layer, one kv head, hd 8, latent 8: F = 4 + 8 = 12.
  const model::ModelConfig c = test::gate_config(1, 1, 1, 8, 8, "synthetic");
  gates::GateSet set = sfc_set(c, {{"hidden", 2}, {"latent", 8}}, 1);
  auto fill = [&](const std::string& name, const std::vector<float>& v) {
    torch::Tensor& t = set.params.at(name);
    REQUIRE(t.numel() == int64_t(v.size()));
    t = torch::tensor(v).view(t.sizes()).clone();
  };
  // Rows of w_ih in the order r0, r1, z0, z1, n0, n1 (12 columns each).
  std::vector<float> w_ih(6 * 12, 0.0f);
  for (int i = 0; i < 12; ++i) w_ih[size_t(i)] = 0.1f;  // r0: 0.1 everywhere
  w_ih[1 * 12 + 0] = -0.3f;                             // r1 on x0
  w_ih[2 * 12 + 1] = 0.2f;                              // z0 on x1
  w_ih[3 * 12 + 11] = 0.5f;                             // z1 on x11
  w_ih[4 * 12 + 0] = 1.0f;                              // n0 on x0
  w_ih[5 * 12 + 1] = -0.25f;                            // n1 on x1
  fill("layers.0.sfc.w_ih", w_ih);
  fill("layers.0.sfc.b_ih", {0.05f, 0, 0, 0.1f, 0.1f, 0});
  fill("layers.0.sfc.w_hh", {0.5f, 0, 0, 1, -1, 0, 1, 1, 2, 0, 0, -1});
  fill("layers.0.sfc.b_hh", {-0.1f, 0, 0.1f, 0, -0.3f, 0.05f});
  fill("sfc_shared.head.weight", {1.5f, -1, 0.5f, 2});
  fill("sfc_shared.head.bias", {0.1f, -0.2f});
  std::vector<float> x(12, 0.0f);
  x[0] = 1, x[1] = 2, x[11] = -1;
  const float h0 = 0.4f, h1 = -0.2f;

  // By hand: W_i x, W_h h and the biases of each gate and unit.
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  const double r0 = sig(0.1 * (1 + 2 - 1) + 0.05 + 0.5 * 0.4 - 0.1);  // sigma(0.35)
  const double r1 = sig(-0.3 * 1 + 0 + 1 * -0.2 + 0);                 // sigma(-0.5)
  const double u0 = sig(0.2 * 2 + 0 + -1 * 0.4 + 0.1);                // sigma(0.1)
  const double u1 = sig(0.5 * -1 + 0.1 + (0.4 - 0.2) + 0);            // sigma(-0.2)
  const double n0 = std::tanh(1.0 * 1 + 0.1 + r0 * (2 * 0.4 - 0.3));
  const double n1 = std::tanh(-0.25 * 2 + 0 + r1 * (-1 * -0.2 + 0.05));
  const double e0 = (1 - u0) * n0 + u0 * 0.4, e1 = (1 - u1) * n1 + u1 * -0.2;
  const double now = 1.5 * e0 - e1 + 0.1, hor = 0.5 * e0 + 2 * e1 - 0.2;

  SECTION("the LibTorch cell") {
    torch::Tensor hn = gates::sfc_gru_step(
        torch::tensor(x).view({1, 1, 12}), torch::tensor({h0, h1}).view({1, 1, 2}),
        set.param("layers.0.sfc.w_ih"), set.param("layers.0.sfc.w_hh"),
        set.param("layers.0.sfc.b_ih"), set.param("layers.0.sfc.b_hh"));
    CHECK(hn[0][0][0].item<double>() == Approx(e0).epsilon(1e-6));
    CHECK(hn[0][0][1].item<double>() == Approx(e1).epsilon(1e-6));
  }
  SECTION("SfcForecaster::step") {
    const gates::SfcForecaster net(set);
    float h[2] = {h0, h1}, logits[2];
    net.step(0, 0, x.data(), h, logits);
    CHECK(h[0] == Approx(e0).epsilon(1e-6));
    CHECK(h[1] == Approx(e1).epsilon(1e-6));
    CHECK(logits[0] == Approx(now).epsilon(1e-6));
    CHECK(logits[1] == Approx(hor).epsilon(1e-6));
  }
}

TEST_CASE("sfc: tau quantile, labels, horizon labels and onsets of a hand-made matrix",
          "[gates][sfc][sfc_train]") {
  // numpy.quantile([0.1, 0.4, 0.2, 0.3], 0.5) = 0.25; at 0.9: 0.37.
  CHECK(gates::sfc_quantile({0.1f, 0.4f, 0.2f, 0.3f}, 0.5) == Approx(0.25));
  CHECK(gates::sfc_quantile({0.1f, 0.4f, 0.2f, 0.3f}, 0.9) == Approx(0.37));
  CHECK(gates::sfc_quantile({0.7f}, 0.9) == Approx(0.7));

  // One group, 4 tokens: the prompt (0, 1) at step 0, then one token a step.
  // r[s][j] (the received attention; tokens not fed yet absent):
  const std::vector<std::vector<float>> r = {{0.6f, 0.4f},
                                             {0.5f, 0.1f, 0.4f},
                                             {0.1f, 0.2f, 0.3f, 0.4f},
                                             {0.7f, 0.1f, 0.1f, 0.1f},
                                             {0.1f, 0.1f, 0.1f, 0.7f},
                                             {0.1f, 0.6f, 0.2f, 0.1f}};
  // tau at q = 0.5 (the median, interpolated) and y = r > tau:
  const std::vector<float> tau = {0.5f, 0.4f, 0.25f, 0.1f, 0.1f, 0.15f};
  const std::vector<std::vector<uint8_t>> y = {{1, 0},       {1, 0, 0},    {0, 0, 1, 1},
                                               {1, 0, 0, 0}, {0, 0, 0, 1}, {0, 1, 1, 0}};
  gates::SfcSequence s;
  s.S = 6, s.T = 4, s.NG = 1, s.head_dim = 1;
  s.first = {0, 2, 3, 4, 4, 4};  // steps 3.. feed nothing new in this matrix: T stays 4
  s.fed_at = {0, 0, 1, 2};
  s.y_now = torch::zeros({6, 1, 4}, torch::kUInt8);
  for (size_t t = 0; t < r.size(); ++t) {
    std::vector<uint8_t> got(r[t].size());
    CHECK(gates::sfc_step_labels(r[t], 0.5, got.data()) == Approx(tau[t]));
    CHECK(got == y[t]);
    for (size_t j = 0; j < got.size(); ++j) s.y_now[int64_t(t)][0][int64_t(j)] = got[j];
  }

  SECTION("horizon labels, H = 2: any of steps t, t + 1; the last step masked") {
    torch::Tensor yh, valid;
    gates::sfc_horizon_labels(s.y_now, 2, &yh, &valid);
    const std::vector<std::vector<int>> expect = {{1, 0, 0, 0}, {1, 0, 1, 1}, {1, 0, 1, 1},
                                                  {1, 0, 0, 1}, {0, 1, 1, 1}, {0, 0, 0, 0}};
    for (int t = 0; t < 6; ++t) {
      CHECK(valid[t].item<bool>() == (t <= 4));
      for (int j = 0; j < 4; ++j) CHECK(yh[t][0][j].item<int>() == expect[size_t(t)][size_t(j)]);
    }
  }
  SECTION("onsets (y_now(s) = 1, y_now(s - 1) = 0) marked at s - lead, lead 1") {
    // Onsets: token 0 at s = 3; token 1 at s = 5; token 2 at s = 2 (its
    // feeding step 1 had y = 0) and s = 5; token 3 at s = 4. With lead 1 the
    // forecast step is s - 1 and must be after the feeding step: token 2's
    // onset at 2 needs a forecast at 1 (its own feeding step): dropped.
    gates::SfcForward f;
    f.t0 = 1;
    f.active = torch::tensor(s.fed_at, torch::kInt64).unsqueeze(0) <
               torch::arange(1, 6, torch::kInt64).unsqueeze(1);
    gates::SfcLossOptions o;
    o.lead = 1;
    o.horizon = 2;
    const gates::SfcTargets tg = gates::sfc_targets(s, f, torch::tensor({0}, torch::kInt64),
                                                    torch::arange(4, torch::kInt64), o);
    std::vector<std::pair<int, int>> onsets;  // (forecast step, token)
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 4; ++j)
        if (tg.onset_at[0][i][j].item<bool>()) onsets.emplace_back(i + 1, j);
    CHECK(onsets == std::vector<std::pair<int, int>>{{2, 0}, {3, 3}, {4, 1}, {4, 2}});
    // Labels of the entries the loss reads: now and horizon masked alike
    // where the token has no forecast, the horizon also at the last step.
    CHECK(tg.valid_now.sum().item<int64_t>() == 2 + 3 + 4 + 4 + 4);
    CHECK(tg.valid_hor.sum().item<int64_t>() == 2 + 3 + 4 + 4);
    CHECK(tg.y_now[0][2][3].item<float>() == 0);  // step 3, token 3
    CHECK(tg.y_hor[0][2][3].item<float>() == 1);  // step 4 is above tau
  }
}

TEST_CASE("sfc: the asymmetric loss weighs a missed positive alpha times a false positive",
          "[gates][sfc][sfc_train]") {
  for (double gamma : {0.0, 1.0, 2.0})
    for (double conf : {0.6, 0.8, 0.95}) {
      // Missed positive: y = 1 at p = 1 - conf; false positive: y = 0 at p = conf.
      const double logit = std::log(conf / (1 - conf));
      const torch::Tensor missed =
          gates::sfc_focal_bce(torch::tensor({float(-logit)}), torch::tensor({1.0f}), 6.0, gamma);
      const torch::Tensor false_pos =
          gates::sfc_focal_bce(torch::tensor({float(logit)}), torch::tensor({0.0f}), 6.0, gamma);
      INFO("gamma " << gamma << " confidence " << conf);
      CHECK(missed.item<double>() == Approx(6.0 * false_pos.item<double>()).epsilon(1e-5));
      // By hand: conf^gamma (-log(1 - conf)).
      CHECK(false_pos.item<double>() ==
            Approx(std::pow(conf, gamma) * -std::log(1 - conf)).epsilon(1e-5));
    }
  // alpha = 1, gamma = 0: the symmetric ablation is plain BCE.
  const torch::Tensor logits = torch::tensor({-3.0f, -0.5f, 0.0f, 2.0f, 40.0f});
  const torch::Tensor y = torch::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f});
  CHECK(torch::allclose(
      gates::sfc_focal_bce(logits, y, 1.0, 0.0),
      torch::binary_cross_entropy_with_logits(logits, y, {}, {}, at::Reduction::None), 1e-6, 1e-6));
  // Saturated logits stay finite, with finite gradients.
  torch::Tensor big = torch::tensor({-200.0f, 200.0f}).requires_grad_(true);
  gates::sfc_focal_bce(big, torch::tensor({0.0f, 1.0f}), 6.0, 2.0).sum().backward();
  CHECK(torch::isfinite(big.grad()).all().item<bool>());
}

namespace {

// A stories260K trace of 64-odd prompt tokens and 48 decode steps, captured
// by the kvscope binary (policy full, received attention unless `levels`).
std::string capture_stories(const std::string& dir, const std::string& name, uint64_t seed,
                            const std::string& policy = "full",
                            const std::string& levels = "received") {
  const std::string out = dir + "/" + name + ".kvtrace.h5";
  const std::string cmd =
      test::kvscope_exe() + " capture --model " + test::stories_model_path() + " --tokenizer " +
      test::stories_tokenizer_path() +
      " --prompt 'Once upon a time, there was a little girl named Lily. She loved to play "
      "outside in the park with her friends. One day, she saw a big red ball under a tree. She "
      "ran to the ball and picked it up.' --temperature 0.8 --seed " +
      std::to_string(seed) + " --max-new 49 --threads 1 -q --policy " + policy + " --capture " +
      levels + " -o " + out;
  std::string log;
  const int rc = test::run_command(cmd, &log);
  INFO(cmd << "\n" << log);
  REQUIRE(rc == 0);
  return out;
}

gates::SfcTrainOptions sfc_traces(const std::vector<std::string>& traces,
                                  const std::vector<std::string>& holdout) {
  gates::SfcTrainOptions s;
  s.traces = traces;
  s.holdout = holdout;
  s.tokens = 48;
  return s;
}

gates::TrainOptions sfc_options(const std::string& out) {
  gates::TrainOptions o;
  o.kind = GateKind::SfcGru;
  o.model.model = test::stories_model_path();
  o.model.threads = 1;
  o.hyper_given = {{"horizon", 8}};
  o.steps = 30;
  o.lr = 1e-2;
  o.seed = 5;
  o.quiet = true;
  o.output = out;
  return o;
}

}  // namespace

TEST_CASE("sfc: training on a stories260K trace lowers the loss", "[gates][sfc][sfc_train]") {
  const std::string dir = test::temp_dir();
  const std::string a = capture_stories(dir, "a", 1), b = capture_stories(dir, "b", 2);
  const std::string out = dir + "/sfc.safetensors";
  const gates::TrainResult r = gates::train_sfc(sfc_options(out), sfc_traces({a}, {b}));
  const std::vector<double> loss = test::csv_column(dir + "/sfc.csv", "loss");
  REQUIRE(loss.size() == 30);
  INFO("first steps " << test::mean(loss, 0, 5) << ", last steps " << test::mean(loss, 25, 30));
  CHECK(test::mean(loss, 25, 30) < 0.8 * test::mean(loss, 0, 5));
  // The file loads as a forecaster of the model and carries held-out numbers.
  const gates::GateSet g = gates::load_gates(out, test::stories_shape());
  CHECK(g.kind == GateKind::SfcGru);
  const nlohmann::json& h = r.summary.at("heldout");
  for (const char* output : {"now", "horizon"}) {
    const double auroc = h.at(output).at("auroc").get<double>();
    CHECK(auroc > 0.0);
    CHECK(auroc < 1.0);
  }
  CHECK(h.at("onsets").get<double>() > 0);
}

TEST_CASE("sfc: traces of another model, policy or capture level are refused",
          "[gates][sfc][sfc_train]") {
  const std::string dir = test::temp_dir();
  SECTION("another model: its name, or its sha256 when the trace has one") {
    const std::string a = capture_stories(dir, "a", 1);
    gates::SfcTraceHeader h = gates::check_sfc_trace(a);
    model::ModelConfig other = test::stories_shape();
    other.name = "SmolLM2-135M-Instruct";
    try {
      gates::check_sfc_model(h, other, test::stories_model_path());
      FAIL("accepted a trace of another model");
    } catch (const InputError& e) {
      CHECK(e.file() == a);
      CHECK(e.field() == "/run model_name");
    }
    h.model_sha256 = std::string(64, '0');
    try {
      gates::check_sfc_model(h, test::stories_shape(), test::stories_model_path());
      FAIL("accepted a trace whose model hash differs");
    } catch (const InputError& e) {
      CHECK(e.field() == "/run model_sha256");
    }
  }
  SECTION("no received attention: kvscope train exits 2 naming the trace and field") {
    const std::string a = capture_stories(dir, "events", 1, "full", "events");
    std::string log;
    const int rc = test::run_command(test::kvscope_exe() + " train --policy sfc --traces " + a +
                                         " --steps 1 -o " + dir + "/x.safetensors",
                                     &log);
    INFO(log);
    CHECK(rc == 2);
    CHECK(log.find(a) != std::string::npos);
    CHECK(log.find("/run capture_levels") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir + "/x.safetensors"));
  }
  SECTION("another policy than full") {
    const std::string a = capture_stories(dir, "window", 1, "window:window=16");
    try {
      gates::check_sfc_trace(a);
      FAIL("accepted a trace of another policy");
    } catch (const InputError& e) {
      CHECK(e.file() == a);
      CHECK(e.field() == "/run policy_name");
    }
  }
}

TEST_CASE("sfc: training is deterministic for a seed", "[gates][sfc][sfc_train]") {
  const std::string dir = test::temp_dir();
  const std::string a = capture_stories(dir, "a", 1);
  std::vector<gates::GateSet> runs;
  for (const char* name : {"/one.safetensors", "/two.safetensors"}) {
    gates::TrainOptions o = sfc_options(dir + name);
    o.steps = 4;
    gates::train_sfc(o, sfc_traces({a}, {}));
    runs.push_back(gates::load_gates(dir + name, test::stories_shape()));
  }
  REQUIRE(runs[0].params.size() == runs[1].params.size());
  for (const auto& [name, t] : runs[0].params) {
    INFO(name);
    CHECK(torch::equal(t, runs[1].params.at(name)));
  }
}

TEST_CASE("sfc: the shipped forecasters fit their models and beat the attention EWMA",
          "[gates][sfc][sfc_train]") {
  const std::string res = test::source_dir() + "/resources/gates/";
  SECTION("stories260K: found by the model's sha256, better than x0 alone on a new trace") {
    const model::ModelConfig c = model::inspect_model(test::stories_model_path()).config;
    const gates::GateSet g = gates::load_gates(res + "stories260K-sfc.safetensors", c);
    CHECK(g.meta.at("base_model").at("sha256") == gates::file_sha256(test::stories_model_path()));
    const gates::SfcForecaster net(g);
    CHECK(net.n_layers() == c.n_layers);
    // A trace none of the shipped training traces is: another prompt and seed.
    const std::string dir = test::temp_dir();
    const std::string t = capture_stories(dir, "new", 7);
    generate::ModelOptions mo;
    mo.model = test::stories_model_path();
    mo.threads = 1;
    generate::Engine e = generate::open_engine(mo);
    gates::SfcLabelOptions lo;
    const gates::SfcSequence s = gates::load_sfc_sequence(t, *e.model, lo);
    const nlohmann::json m = gates::sfc_evaluate(g, {s}).to_json();
    INFO(m.dump(1));
    for (const char* output : {"now", "horizon"}) {
      CHECK(m.at(output).at("auroc").get<double>() >
            m.at(output).at("ewma_baseline_auroc").get<double>());
      CHECK(m.at(output).at("auroc").get<double>() > 0.75);
    }
    CHECK(m.at("onsets_forecast_lead").get<double>() > 0.9);
  }
  SECTION("SmolLM2: both files fit the model (read without its weights)") {
    const char* env = std::getenv("KVSCOPE_MODELS_DIR");
    const std::string smol = (env && *env ? env : test::source_dir() + "/models") +
                             std::string("/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!std::filesystem::exists(smol))
      FAIL(
          "SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/fetch-models (or set "
          "KVSCOPE_MODELS_DIR)");
    const model::ModelConfig c = model::inspect_model(smol).config;
    for (const char* f : {"SmolLM2-135M-Instruct-sfc", "SmolLM2-135M-Instruct-sfc_symmetric"}) {
      const gates::GateSet g = gates::load_gates(res + f + ".safetensors", c);
      CHECK(g.meta.at("base_model").at("name") == c.name);
      CHECK(gates::SfcForecaster(g).n_kv_heads() == c.n_kv_heads);
    }
  }
}
