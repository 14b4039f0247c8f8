// KVzap, the policy: the kept sets against W h + b of a random surrogate,
// with and without the local window, and bad surrogate files. The fit:
// tests/train/test_kvzap_training.cpp.
#include <set>
#include <string>

#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

// The kvzap policy with a random surrogate (seeded) after one prefill of n
// tokens: per (layer, kv head) what it holds and what it should hold, the
// `budget - window` best of W h + b before the window and the window.
void check_kvzap_keeps_best(uint64_t seed, int64_t window) {
  const model::ModelConfig c = stories_shape();
  gates::GateSet set =
      gates::init_gates(GateKind::Kvzap, nlohmann::json::object(), gates::GateShape::of(c), 0);
  randomize(set, seed);
  const std::string file = save_temp(set, "kvzap-" + std::to_string(seed) + ".safetensors");
  const int64_t n = 40, budget = 12;
  const Prefilled run =
      prefill_policy(c,
                     "kvzap:budget=" + std::to_string(budget) +
                         ",sinks=0,window=" + std::to_string(window) + ",gates=" + file,
                     n, seed);
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      INFO("layer " << l << ", kv head " << h);
      const std::string p = "layers." + std::to_string(l) + ".kvzap.";
      const torch::Tensor s =
          (run.hidden[size_t(l)].matmul(set.param(p + "weight")[h]) + set.param(p + "bias")[h])
              .narrow(0, 0, n - window);
      const torch::Tensor top = std::get<1>(s.topk(budget - window));
      std::set<int64_t> want;
      for (int64_t i = 0; i < budget - window; ++i) want.insert(top[i].item<int64_t>());
      for (int64_t i = n - window; i < n; ++i) want.insert(i);
      const auto& held = run.held[size_t(l)][size_t(h)];
      CHECK(std::set<int64_t>(held.begin(), held.end()) == want);
    }
}

}  // namespace

TEST_CASE("kvzap: the policy keeps each head's entries of highest W h + b", "[gates][kvzap]") {
  check_kvzap_keeps_best(7, 0);
}

TEST_CASE("kvzap: the newest `window` entries stay, the rest by W h + b", "[gates][kvzap]") {
  check_kvzap_keeps_best(9, 5);
}

TEST_CASE("kvzap: another kind of gate file is refused, naming the kind", "[gates][kvzap]") {
  std::string out;
  const std::string run = kvscope_exe() + " capture --model " + stories_model_path() +
                          " --tokenizer " + stories_tokenizer_path() +
                          " --prompt 'Once upon a time' --max-new 2 -q -o " + temp_dir() +
                          "/bad-kvzap.kvtrace.h5 --policy kvzap:budget=4,gates=";
  CHECK(run_command(run + source_dir() + "/resources/gates/stories260K-wgkv.safetensors", &out) ==
        2);
  CHECK(out.find("kind kvzap") != std::string::npos);
  CHECK(run_command(kvscope_exe() + " capture --model " + stories_model_path() + " --tokenizer " +
                        stories_tokenizer_path() +
                        " --prompt 'Once upon a time' --max-new 2 -q -o " + temp_dir() +
                        "/bad-kvzap2.kvtrace.h5 --policy dms:scorer=kvzap",
                    &out) == 2);
  CHECK(out.find("kvzap:gates") != std::string::npos);
}

}  // namespace kvscope::test
