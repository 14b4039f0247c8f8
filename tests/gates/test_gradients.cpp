// The gradients the trainer follows, against central finite differences in
// double precision: WG-KV's log-gate bias and the retention bias (d loss /
// d g, d loss / d log beta through the gated attention), Attention-Gate's
// straight-through estimator (d loss / d s = (d loss / d M at the hard mask)
// * sigma'(s + gamma)), and the dense attention itself against a loop.
#include <cmath>

#include "capture/train/gated_attention.h"
#include "tests/gates/gate_test_util.h"

using namespace kvscope;

namespace {

struct Qkv {
  torch::Tensor q, k, v, probe;
};

Qkv random_qkv(int64_t n, int64_t H, int64_t K, int64_t hd, uint64_t seed) {
  torch::manual_seed(seed);
  auto o = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::randn({n, H, hd}, o), torch::randn({n, K, hd}, o), torch::randn({n, K, hd}, o),
          torch::randn({n, H, hd}, o)};
}

// A scalar of the attention output that depends on every entry.
torch::Tensor loss_of(const Qkv& x, const torch::Tensor& bias, const torch::Tensor& mult) {
  return (gates::dense_attention(x.q, x.k, x.v, 0.5, 0, bias, mult) * x.probe).sum();
}

template <typename F>
double central_difference(torch::Tensor& x, int64_t flat_index, F f, double eps = 1e-6) {
  torch::NoGradGuard g;
  double* p = x.data_ptr<double>() + flat_index;
  const double keep = *p;
  *p = keep + eps;
  const double up = torch::Tensor(f()).item<double>();
  *p = keep - eps;
  const double down = torch::Tensor(f()).item<double>();
  *p = keep;
  return (up - down) / (2 * eps);
}

}  // namespace

TEST_CASE("dense attention equals a loop over softmax(q.k * scale + bias) v, GQA and causal",
          "[gates][grad]") {
  Qkv x = random_qkv(5, 4, 2, 3, 1);
  torch::Tensor bias = torch::randn({2, 5, 5}, torch::kFloat64);
  torch::Tensor out = gates::dense_attention(x.q, x.k, x.v, 0.5, 0, bias, torch::Tensor());
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t kv = h / 2;
      std::vector<double> w;
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double s =
            (x.q[i][h] * x.k[j][kv]).sum().item<double>() * 0.5 + bias[kv][i][j].item<double>();
        w.push_back(std::exp(s));
        z += w.back();
      }
      for (int64_t c = 0; c < 3; ++c) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += w[size_t(j)] / z * x.v[j][kv][c].item<double>();
        CHECK(out[i][h][c].item<double>() == Approx(o).epsilon(1e-12));
      }
    }
}

TEST_CASE("WG-KV log-gate bias: d loss / d g matches finite differences, zero inside the window",
          "[gates][grad]") {
  const int64_t n = 9, W = 3;
  Qkv x = random_qkv(n, 4, 2, 4, 2);
  torch::manual_seed(3);
  torch::Tensor g = (torch::rand({2, n}, torch::kFloat64) * 0.9 + 0.05).requires_grad_(true);
  auto f = [&] { return loss_of(x, gates::wgkv_log_bias(g, W), torch::Tensor()); };
  f().backward();
  torch::Tensor grad = g.grad().clone();
  for (int64_t idx = 0; idx < 2 * n; ++idx) {
    const double fd = central_difference(g, idx, f);
    CHECK(grad.view(-1)[idx].item<double>() == Approx(fd).margin(1e-7).epsilon(1e-5));
  }
  // The last W keys are inside every later query's window: their g never counts.
  for (int64_t j = n - W; j < n; ++j) CHECK(grad[0][j].item<double>() == 0.0);
  CHECK(grad.abs().sum().item<double>() > 1e-3);
}

TEST_CASE("retention bias (i - j) log beta_j: d loss / d log beta matches finite differences",
          "[gates][grad]") {
  const int64_t n = 8;
  Qkv x = random_qkv(n, 2, 2, 4, 4);
  torch::manual_seed(5);
  torch::Tensor lb = (-torch::rand({2, n}, torch::kFloat64)).requires_grad_(true);
  auto f = [&] { return loss_of(x, gates::retention_bias(lb), torch::Tensor()); };
  f().backward();
  torch::Tensor grad = lb.grad().clone();
  for (int64_t idx = 0; idx < 2 * n; ++idx)
    CHECK(grad.view(-1)[idx].item<double>() ==
          Approx(central_difference(lb, idx, f)).margin(1e-7).epsilon(1e-5));
  // The last key is only read by itself at distance 0: no gradient.
  CHECK(grad[1][n - 1].item<double>() == 0.0);
  // And the soft cache size S_t = sum_{i<=t} beta_i^(t-i): differentiate it too.
  auto size_at_end = [&] {
    return (torch::exp(gates::retention_bias(lb)) * torch::ones({n, n}, torch::kFloat64).tril())
        .sum(-1)
        .select(1, n - 1)
        .sum();
  };
  lb.grad().zero_();
  size_at_end().backward();
  for (int64_t idx = 0; idx < 2 * n; ++idx)
    CHECK(lb.grad().view(-1)[idx].item<double>() ==
          Approx(central_difference(lb, idx, size_at_end)).margin(1e-7).epsilon(1e-5));
}

TEST_CASE(
    "Attention-Gate straight-through flags: hard forward, sigma' backward, = finite differences of "
    "the mask",
    "[gates][grad]") {
  const int64_t n = 7;
  const double gamma = 0.5, tau = 0.5;
  Qkv x = random_qkv(n, 4, 2, 4, 6);
  torch::manual_seed(7);
  torch::Tensor s = (torch::randn({2, n}, torch::kFloat64) * 2).requires_grad_(true);
  torch::Tensor flags = gates::straight_through_flags(s, gamma, tau);
  // Forward: exactly the hard decisions.
  torch::Tensor prob = torch::sigmoid(s.detach() + gamma);
  CHECK(torch::equal(flags.detach(), (prob > tau).to(torch::kFloat64)));
  const int64_t kept = flags.detach().sum().item<int64_t>();
  CHECK(kept > 0);
  CHECK(kept < 2 * n);  // both kinds of decision occur
  loss_of(x, torch::Tensor(), gates::attention_gate_mask(flags)).backward();
  // Backward: the loss as a function of the continuous column mask M_j at the
  // hard flags, differenced, times sigma'(s_j + gamma).
  torch::Tensor hard = (prob > tau).to(torch::kFloat64).clone();
  auto f = [&] { return loss_of(x, torch::Tensor(), gates::attention_gate_mask(hard)); };
  for (int64_t idx = 0; idx < 2 * n; ++idx) {
    const double dm = central_difference(hard, idx, f);
    const double p = prob.view(-1)[idx].item<double>();
    CHECK(s.grad().view(-1)[idx].item<double>() ==
          Approx(dm * p * (1 - p)).margin(1e-8).epsilon(1e-5));
  }
  // An evicted key still gets a gradient (the multiplicative mask), so the
  // gate can learn to keep it; the additive -INF form would give it none.
  bool evicted_has_grad = false;
  for (int64_t idx = 0; idx < 2 * n - 2; ++idx)  // the last key is read only by itself
    if (hard.view(-1)[idx].item<double>() == 0 &&
        std::abs(s.grad().view(-1)[idx].item<double>()) > 1e-9)
      evicted_has_grad = true;
  CHECK(evicted_has_grad);
}

TEST_CASE(
    "Attention-Gate mask: a flag-0 key is invisible to every other query, the diagonal always kept",
    "[gates][grad]") {
  const int64_t n = 6;
  Qkv x = random_qkv(n, 2, 1, 4, 8);
  torch::Tensor flags = torch::tensor({{1.0, 0.0, 1.0, 0.0, 0.0, 1.0}}, torch::kFloat64);
  torch::Tensor out = gates::dense_attention(x.q, x.k, x.v, 0.5, 0, torch::Tensor(),
                                             gates::attention_gate_mask(flags));
  // Query 4 reads keys 0, 2 and itself.
  torch::Tensor idx = torch::tensor({0, 2, 4});
  torch::Tensor s = torch::mv(x.k.index_select(0, idx).select(1, 0), x.q[4][1]) * 0.5;
  torch::Tensor want = torch::mv(x.v.index_select(0, idx).select(1, 0).t(), torch::softmax(s, 0));
  CHECK(torch::allclose(out[4][1], want, 1e-12, 1e-12));
  // Query 1 (flag 0) still reads key 0 and itself.
  torch::Tensor idx1 = torch::tensor({0, 1});
  torch::Tensor s1 = torch::mv(x.k.index_select(0, idx1).select(1, 0), x.q[1][0]) * 0.5;
  CHECK(torch::allclose(
      out[1][0], torch::mv(x.v.index_select(0, idx1).select(1, 0).t(), torch::softmax(s1, 0)),
      1e-12, 1e-12));
}
