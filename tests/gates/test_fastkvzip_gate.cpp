// Fast KVzip's gate: its forward against the formula written out per token,
// head and query of the group. Training: tests/train/test_fastkvzip_training.cpp;
// the policy: tests/policies/test_fastkvzip.cpp.
#include "capture/gates/fastkvzip_gate.h"
#include "tests/gates/gate_test_util.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

}  // namespace

TEST_CASE("fastkvzip: the gate is a softmax of the token's own key against the sink keys",
          "[gates][fastkvzip]") {
  const model::ModelConfig c = stories_shape();
  const int64_t K = c.n_kv_heads, G = c.n_heads / K, dim = 4, S = 3, n = 7;
  gates::GateSet set =
      gates::init_gates(GateKind::FastKvzip,
                        gates::resolve_hyperparameters(GateKind::FastKvzip, gates::GateShape::of(c),
                                                       small_gate(), ""),
                        gates::GateShape::of(c), 0);
  randomize(set, 3, 0.5);
  const gates::FastKvzipLayer p = gates::fastkvzip_layer(set, 1);
  torch::manual_seed(5);
  const torch::Tensor h = torch::randn({n, c.hidden_size});
  const torch::Tensor got = gates::fastkvzip_forward(p, h, K, G, dim);
  REQUIRE(got.sizes() == torch::IntArrayRef({n, K}));
  auto rms = [&](const torch::Tensor& x, const torch::Tensor& w) {
    return x / std::sqrt(x.square().mean().item<double>() + 1e-6) * w;
  };
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double mean = 0;
      const torch::Tensor key = rms(p.k_w.narrow(0, k * dim, dim).matmul(h[t]), p.k_norm);  // [dim]
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = (k * G + g) * dim;
        const torch::Tensor q =
            rms(p.q_w.narrow(0, row, dim).matmul(h[t]) + p.q_b.narrow(0, row, dim), p.q_norm);
        const double z = key.dot(q).item<double>() / 2.0 + p.b[k][0][g].item<double>();
        double denominator = 1;
        for (int64_t s = 0; s < S; ++s)
          denominator += std::exp(p.k_base[k][0][s].dot(q).item<double>() / 2.0 - z);
        mean += 1.0 / denominator / double(G);
      }
      INFO("token " << t << ", kv head " << k);
      CHECK(got[t][k].item<double>() == Approx(mean).epsilon(1e-5));
    }
}

}  // namespace kvscope::test
