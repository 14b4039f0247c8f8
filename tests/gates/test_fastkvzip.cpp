// Fast KVzip: the gate's forward against the formula written out per token,
// head and query of the group; training lowers the BCE against the KVzip
// targets; the policy's global selection; bad gate files.
#include <set>

#include "capture/gates/fastkvzip_gate.h"
#include "capture/gates/trainer.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

nlohmann::json small_gate() {
  return {{"dim", 4}, {"base_keys", 3}};
}

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

TEST_CASE("fastkvzip: training lowers the BCE against the KVzip targets", "[gates][fastkvzip]") {
  const std::string text = write_story_text("fastkvzip-text.txt", 4);
  gates::TrainOptions o;
  o.kind = GateKind::FastKvzip;
  o.model.model = stories_model_path();
  o.model.tokenizer = stories_tokenizer_path();
  o.model.threads = 1;
  o.data.paths = {text};
  o.data.holdout = 0.1;
  o.seq_len = 24;
  o.steps = 3;
  o.quiet = true;
  o.hyper_given = {{"iters", 150}, {"batch", 32}};
  o.output = temp_dir() + "/stories-fastkvzip.safetensors";
  const gates::TrainResult r = gates::train_gates(o);
  generate::Engine engine = generate::open_engine(o.model);
  const gates::GateSet g = gates::load_gates(o.output, engine.model->config());
  CHECK(g.kind == GateKind::FastKvzip);
  CHECK(g.meta["training"]["samples"] == 3 * 24);
  CHECK(g.meta["training"]["heldout_bce"].size() == size_t(engine.model->config().n_layers));
  const double first = r.summary["first_train_bce_per_layer"],
               last = r.summary["final_train_bce_per_layer"];
  CHECK(last < 0.8 * first);
}

TEST_CASE("fastkvzip: one ranking over every layer and head; sinks and the local window stay",
          "[gates][fastkvzip]") {
  const model::ModelConfig c = stories_shape();
  gates::GateSet set =
      gates::init_gates(GateKind::FastKvzip,
                        gates::resolve_hyperparameters(GateKind::FastKvzip, gates::GateShape::of(c),
                                                       small_gate(), ""),
                        gates::GateShape::of(c), 0);
  randomize(set, 11, 0.5);
  const std::string file = save_temp(set, "fastkvzip-random.safetensors");
  const int64_t n = 50, budget = 10, L = c.n_layers, K = c.n_kv_heads;
  const Prefilled run = prefill_policy(
      c, "fastkvzip:budget=" + std::to_string(budget) + ",sinks=2,window_ratio=0.1,gates=" + file,
      n, 6);
  std::vector<torch::Tensor> scores;  // per layer [n, K]
  for (int64_t l = 0; l < L; ++l)
    scores.push_back(gates::fastkvzip_forward(gates::fastkvzip_layer(set, l), run.hidden[size_t(l)],
                                              K, c.n_heads / K, 4));
  int64_t held = 0;
  double lowest_kept = 1e30, highest_evicted = -1e30;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h) {
      const auto& pos = run.held[size_t(l)][size_t(h)];
      const std::set<int64_t> kept(pos.begin(), pos.end());
      held += int64_t(kept.size());
      for (int64_t p : {0, 1, 45, 46, 47, 48, 49}) CHECK(kept.count(p) == 1);  // 2 sinks, 5 local
      for (int64_t p = 2; p < 45; ++p) {
        const double s = scores[size_t(l)][p][h].item<double>();
        if (kept.count(p))
          lowest_kept = std::min(lowest_kept, s);
        else
          highest_evicted = std::max(highest_evicted, s);
      }
    }
  CHECK(held == L * K * budget);
  CHECK(highest_evicted <= lowest_kept);
}

TEST_CASE("fastkvzip: another kind of gate file is refused, naming the kind",
          "[gates][fastkvzip]") {
  std::string out;
  const std::string run = kvscope_exe() + " capture --model " + stories_model_path() +
                          " --tokenizer " + stories_tokenizer_path() +
                          " --prompt 'Once upon a time' --max-new 2 -q -o " + temp_dir() +
                          "/bad-fastkvzip.kvtrace.h5 --policy fastkvzip:budget=2,gates=";
  CHECK(run_command(run + source_dir() + "/resources/gates/stories260K-kvzap.safetensors", &out) ==
        2);
  CHECK(out.find("kind fastkvzip") != std::string::npos);
}

}  // namespace kvscope::test
