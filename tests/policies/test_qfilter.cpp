// Q-Filters, the policy: the kept keys against u.k, and bad filter files.
// The calibration: tests/train/test_qfilter_calibration.cpp.
#include <set>

#include "capture/attention/step_driver.h"
#include "capture/policy/registry.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

}  // namespace

TEST_CASE("qfilter: the policy keeps the keys of largest projection on the filter",
          "[gates][qfilter]") {
  const model::ModelConfig c = stories_shape();
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(GateKind::QFilter, nlohmann::json::object(), shape, 0);
  randomize(set, 5);
  const std::string file = save_temp(set, "qfilter-random.safetensors");
  const int64_t n = 40, budget = 12, max_tokens = 64;
  policy::PolicyInstance pi =
      policy::make_policy("qfilter:budget=" + std::to_string(budget) + ",gates=" + file);
  pi.policy->setup({&c, max_tokens, n, 16});
  policy::StepDriver driver(c, policy::StepDriver::Options{16, max_tokens, n}, *pi.policy, "test");
  torch::InferenceMode guard;
  driver.begin_step(0, n);
  std::vector<torch::Tensor> keys;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    model::AttentionInputs in = gate_inputs(c, l, 0, n, 3);
    keys.push_back(in.k.clone());
    driver.attend(in);
  }
  driver.end_step();
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      INFO("layer " << l << ", kv head " << h);
      const torch::Tensor u = set.param("layers." + std::to_string(l) + ".qfilter")[h];
      const torch::Tensor proj = keys[size_t(l)].select(1, h).matmul(u);  // [n]
      const torch::Tensor top = std::get<1>(proj.topk(budget));
      std::set<int64_t> want;
      for (int64_t i = 0; i < budget; ++i) want.insert(top[i].item<int64_t>());
      const auto& held = driver.cache().positions(l, h, 0);
      CHECK(std::set<int64_t>(held.begin(), held.end()) == want);
    }
}

TEST_CASE("qfilter: another kind of gate file, or filters of another model, are refused",
          "[gates][qfilter]") {
  const std::string run = kvscope_exe() + " capture --model " + stories_model_path() +
                          " --tokenizer " + stories_tokenizer_path() +
                          " --prompt 'Once upon a time' --max-new 2 -q -o " + temp_dir() +
                          "/bad-qfilter.kvtrace.h5 --policy qfilter:budget=4,gates=";
  std::string out;
  const std::string wgkv = source_dir() + "/resources/gates/stories260K-wgkv.safetensors";
  CHECK(run_command(run + wgkv, &out) == 2);
  CHECK(out.find("kind qfilter") != std::string::npos);
  const std::string smol =
      source_dir() + "/resources/gates/SmolLM2-135M-Instruct-qfilter.safetensors";
  CHECK(run_command(run + smol, &out) == 2);
  CHECK(out.find("layers.0.qfilter") != std::string::npos);
}

}  // namespace kvscope::test
