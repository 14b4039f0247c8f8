// Fast KVzip, the policy: one global selection over every layer and head
// by the gate's scores, sinks and the local window kept, and bad gate files.
// The gate: tests/gates/test_fastkvzip_gate.cpp.
#include <set>

#include "capture/gates/fastkvzip_gate.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

}  // namespace

TEST_CASE("fastkvzip: one ranking over every layer and head, sinks and the local window stay",
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
