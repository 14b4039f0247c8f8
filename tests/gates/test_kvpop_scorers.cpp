// KVpop's scorers (seed 003) against their equations: the mLSTM's recurrent
// form against hand arithmetic and against the parallel form, delayed
// readout reading exactly the tokens up to q, gradients against finite
// differences, the decay and the hyperparameters' bounds. The policy:
// tests/policies/test_kvpop.cpp.
#include <algorithm>
#include <cmath>

#include "capture/gates/kvpop_scorer.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"

using namespace kvscope;
using gates::GateKind;
using test::kvpop_set;

namespace {

// ---- scalar reference of the mLSTM (eq. 37-42), written out by hand ----

std::vector<double> softmax_d(const std::vector<double>& u, double sign) {
  double mx = -1e300, sum = 0;
  for (double x : u) mx = std::max(mx, sign * x);
  std::vector<double> e;
  for (double x : u) e.push_back(std::exp(sign * x - mx)), sum += e.back();
  for (double& x : e) x /= sum;
  return e;
}

struct RefToken {
  std::vector<double> q, k, v;  // features F, F, P
  double log_i, log_f;
};

RefToken ref_token(const gates::GateSet& g, int64_t h, const std::vector<double>& x) {
  const std::string p = "layers.0.kvpop.mlstm.";
  const int64_t P = g.param(p + "wq").size(2), X = int64_t(x.size());
  auto proj = [&](const char* name) {
    std::vector<double> out(size_t(P), 0.0);
    auto w = g.param(p + name).accessor<float, 3>();
    for (int64_t j = 0; j < P; ++j)
      for (int64_t i = 0; i < X; ++i) out[size_t(j)] += x[size_t(i)] * w[h][i][j];
    return out;
  };
  auto hedgehog = [](const std::vector<double>& u) {
    std::vector<double> a = softmax_d(u, 1), b = softmax_d(u, -1);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto dot_gate = [&](const char* w, const char* b) {
    auto wa = g.param(p + w).accessor<float, 2>();
    double s = g.param(p + b).accessor<float, 1>()[h];
    for (int64_t i = 0; i < X; ++i) s += x[size_t(i)] * wa[h][i];
    return s;
  };
  RefToken t{hedgehog(proj("wq")), hedgehog(proj("wk")), proj("wv"), dot_gate("wi", "bi"), 0};
  const double fpre = dot_gate("wf", "bf");
  t.log_f = -std::log1p(std::exp(-fpre));
  return t;
}

// Unstabilised recurrence C_t = f C + i k v^T, z_t = f z + i k, then
// r = a . SiLU(q^T C / q^T z) + b: small inputs keep exp(log i) finite.
std::vector<double> ref_mlstm_scores(const gates::GateSet& g, int64_t h,
                                     const std::vector<std::vector<double>>& xs, int64_t delay) {
  const int64_t n = int64_t(xs.size());
  std::vector<RefToken> tok;
  for (const auto& x : xs) tok.push_back(ref_token(g, h, x));
  const size_t F = tok[0].q.size(), P = tok[0].v.size();
  std::vector<std::vector<double>> C(F, std::vector<double>(P, 0.0));
  std::vector<double> z(F, 0.0), out(size_t(n), NAN);
  auto a = g.param("layers.0.kvpop.mlstm.out_w").accessor<float, 2>();
  const double b = g.param("layers.0.kvpop.mlstm.out_b").accessor<float, 1>()[h];
  auto read = [&](const RefToken& t) {
    double den = 0, r = b;
    for (size_t f = 0; f < F; ++f) den += t.q[f] * z[f];
    for (size_t j = 0; j < P; ++j) {
      double num = 0;
      for (size_t f = 0; f < F; ++f) num += t.q[f] * C[f][j];
      const double hj = num / den;
      r += a[h][int64_t(j)] * hj / (1 + std::exp(-hj));
    }
    return r;
  };
  for (int64_t p = 0; p < n; ++p) {
    const RefToken& t = tok[size_t(p)];
    const double f = std::exp(t.log_f), i = std::exp(t.log_i);
    for (size_t a1 = 0; a1 < F; ++a1) {
      z[a1] = f * z[a1] + i * t.k[a1];
      for (size_t j = 0; j < P; ++j) C[a1][j] = f * C[a1][j] + i * t.k[a1] * t.v[j];
    }
    const int64_t u = p - delay;
    if (u >= 0) out[size_t(u)] = read(tok[size_t(u)]);
    if (p == n - 1)  // the tokens still in the window read the last state
      for (int64_t u2 = std::max<int64_t>(0, n - delay); u2 < n; ++u2)
        out[size_t(u2)] = read(tok[size_t(u2)]);
  }
  return out;
}

}  // namespace

TEST_CASE("mLSTM scorer: a decode step's few tokens (loops) = the same tokens of a batch",
          "[kvpop]") {
  const model::ModelConfig c = test::gate_config(1, 4, 2, 4, 16);
  gates::GateSet g = kvpop_set(GateKind::KvpopMlstm, c, {{"proj", 3}}, 5);
  torch::manual_seed(11);
  torch::Tensor k = torch::randn({12, 2, 4}), v = torch::randn({12, 2, 4});
  torch::Tensor x = gates::kvpop_inputs(k, v);  // [K, 12, 8]
  torch::NoGradGuard no_grad;
  const gates::MlstmTokens batch = gates::mlstm_tokens(g, 0, x);
  for (int64_t n : {1, 3}) {
    INFO("n " << n);
    const gates::MlstmTokens few = gates::mlstm_tokens(g, 0, x.narrow(1, 5, n));
    CHECK(torch::allclose(few.q, batch.q.narrow(1, 5, n), 1e-5, 1e-6));
    CHECK(torch::allclose(few.k, batch.k.narrow(1, 5, n), 1e-5, 1e-6));
    CHECK(torch::allclose(few.v, batch.v.narrow(1, 5, n), 1e-5, 1e-6));
    CHECK(torch::allclose(few.log_i, batch.log_i.narrow(1, 5, n), 1e-5, 1e-6));
    CHECK(torch::allclose(few.log_f, batch.log_f.narrow(1, 5, n), 1e-5, 1e-6));
  }
  // The readout of raw features equals mlstm_score_of(mlstm_read(...)).
  gates::MlstmState st = gates::mlstm_initial_state(2, 6, 3);
  for (int64_t p = 0; p < 6; ++p) gates::mlstm_write(st, batch, p);
  const torch::Tensor q = batch.q.select(1, 2).contiguous();  // [K, F]
  std::vector<float> s(2);
  gates::mlstm_read_scores(g, 0, st, q.data_ptr<float>(), s.data());
  const torch::Tensor ref = gates::mlstm_score_of(g, 0, gates::mlstm_read(st, q));
  for (int64_t h = 0; h < 2; ++h)
    CHECK(std::fabs(s[size_t(h)] - ref[h].item<float>()) <= 1e-5f * (1 + std::fabs(s[size_t(h)])));
}

TEST_CASE("mLSTM scorer: recurrent form = hand arithmetic = parallel form, delayed and immediate",
          "[kvpop]") {
  const model::ModelConfig c = test::gate_config(1, 4, 2, 4, 16);
  gates::GateSet g = kvpop_set(GateKind::KvpopMlstm, c, {{"proj", 3}}, 5);
  const int64_t n = 12, K = 2, hd = 4;
  torch::manual_seed(9);
  torch::Tensor k = torch::randn({n, K, hd}) * 0.5, v = torch::randn({n, K, hd}) * 0.5;
  torch::Tensor x = gates::kvpop_inputs(k, v);  // [K, n, 8]
  for (int64_t delay : {0, 3}) {
    INFO("delay " << delay);
    torch::Tensor par = gates::mlstm_scores_parallel(g, 0, x, delay);
    // The recurrent (stabilised) form, token by token.
    gates::MlstmTokens tok = gates::mlstm_tokens(g, 0, x);
    gates::MlstmState st = gates::mlstm_initial_state(K, 6, 3);
    torch::Tensor rec = torch::full({K, n}, NAN);
    for (int64_t p = 0; p < n; ++p) {
      gates::mlstm_write(st, tok, p);
      if (p - delay >= 0)
        rec.select(1, p - delay)
            .copy_(gates::mlstm_score_of(g, 0, gates::mlstm_read(st, tok.q.select(1, p - delay))));
    }
    CHECK(torch::allclose(par.narrow(1, 0, n - delay), rec.narrow(1, 0, n - delay), 1e-4, 1e-5));
    for (int64_t h = 0; h < K; ++h) {
      std::vector<std::vector<double>> xs;
      for (int64_t p = 0; p < n; ++p) {
        torch::Tensor row = x[h][p];
        xs.push_back(
            std::vector<double>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel()));
      }
      std::vector<double> ref = ref_mlstm_scores(g, h, xs, delay);
      for (int64_t u = 0; u < n; ++u)
        CHECK(par[h][u].item<double>() == Approx(ref[size_t(u)]).epsilon(1e-4).margin(1e-5));
    }
  }
}

TEST_CASE("mLSTM delayed readout reads exactly the tokens up to q = u + w", "[kvpop]") {
  const model::ModelConfig c = test::gate_config(1, 2, 1, 4, 8);
  gates::GateSet g = kvpop_set(GateKind::KvpopMlstm, c, {}, 2);
  const int64_t n = 16, w = 4, u = 5, q = u + w;
  torch::manual_seed(4);
  torch::Tensor x = torch::randn({1, n, 8});
  const double base = gates::mlstm_scores_parallel(g, 0, x, w)[0][u].item<double>();
  torch::Tensor later = x.clone();
  later.narrow(1, q + 1, n - q - 1).add_(torch::randn({1, n - q - 1, 8}) * 3);
  CHECK(gates::mlstm_scores_parallel(g, 0, later, w)[0][u].item<double>() ==
        Approx(base).epsilon(1e-6));
  torch::Tensor at_q = x.clone();
  at_q[0][q].add_(3.0);
  CHECK(std::abs(gates::mlstm_scores_parallel(g, 0, at_q, w)[0][u].item<double>() - base) > 1e-4);
  // The immediate readout ignores the tokens after u.
  torch::Tensor after_u = x.clone();
  after_u[0][u + 1].add_(3.0);
  CHECK(gates::mlstm_scores_parallel(g, 0, after_u, 0)[0][u].item<double>() ==
        Approx(gates::mlstm_scores_parallel(g, 0, x, 0)[0][u].item<double>()).epsilon(1e-6));
}

TEST_CASE("KVpop scorer gradients match finite differences", "[kvpop]") {
  const model::ModelConfig c = test::gate_config(1, 2, 1, 4, 8);
  for (GateKind kind : {GateKind::KvpopMlp, GateKind::KvpopMlstm}) {
    INFO(gates::gate_kind_name(kind));
    gates::GateSet g = kvpop_set(kind, c, {}, 7);
    for (auto& [name, t] : g.params) t = t.to(torch::kFloat64).requires_grad_(true);
    torch::manual_seed(1);
    torch::Tensor x = torch::randn({1, 10, 8}, torch::kFloat64);
    auto f = [&] {
      return kind == GateKind::KvpopMlp ? gates::kvpop_mlp_scores(g, 0, x).pow(2).sum()
                                        : gates::mlstm_scores_parallel(g, 0, x, 3).pow(2).sum();
    };
    torch::Tensor y = f();
    y.backward();
    for (auto& [name, t] : g.params) {
      if (name.find("decay_logit") != std::string::npos) continue;  // not in the scores
      INFO(name);
      torch::NoGradGuard ng;
      torch::Tensor flat = t.view({-1});
      for (int64_t i = 0; i < std::min<int64_t>(3, flat.numel()); ++i) {
        const double h = 1e-6, old = flat[i].item<double>();
        flat[i] = old + h;
        const double up = f().item<double>();
        flat[i] = old - h;
        const double down = f().item<double>();
        flat[i] = old;
        CHECK(t.grad().view({-1})[i].item<double>() ==
              Approx((up - down) / (2 * h)).epsilon(1e-5).margin(1e-7));
      }
    }
  }
}

TEST_CASE("KVpop decay is eq. 21 and the hyperparameters refuse bad gamma bounds", "[kvpop]") {
  const model::ModelConfig c = test::gate_config(1, 2, 2, 4, 8);
  gates::GateSet g = kvpop_set(GateKind::KvpopMlp, c, {}, 1);
  g.params["layers.0.kvpop.decay_logit"] = torch::tensor({0.0f, 2.0f});
  torch::Tensor lg = gates::kvpop_log_gamma(g, 0);
  const double lo = std::log(0.999), hi = std::log(0.999999);
  CHECK(lg[0].item<double>() == Approx(lo + 0.5 * (hi - lo)));
  CHECK(lg[1].item<double>() == Approx(lo + (1 / (1 + std::exp(-2.0))) * (hi - lo)));
  const gates::GateShape s = gates::GateShape::of(c);
  auto field_of = [&](nlohmann::json given) {
    try {
      gates::resolve_hyperparameters(GateKind::KvpopMlstm, s, given, "--gate");
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  CHECK(field_of({{"gamma_min", 0.0}}) == "--gate.gamma_min");
  CHECK(field_of({{"gamma_max", 1.0}}) == "--gate.gamma_max");
  CHECK(field_of({{"gamma_min", 0.9999}, {"gamma_max", 0.999}}) == "--gate.gamma_min");
  CHECK(field_of({{"readout", "later"}}) == "--gate.readout");
  CHECK(field_of({{"gamma_min", 0.99}, {"gamma_max", 0.9999}}) == "accepted");
}
