// The gate files shipped in resources/gates/: the stories260K and SmolLM2
// files load for their models and drive a capture that records the gate
// scores and per-head occupancy.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;

TEST_CASE(
    "the shipped stories260K gate files load and drive a capture with gate scores and per-head "
    "occupancy",
    "[gates][cli][resources]") {
  const std::string dir = test::temp_dir(), exe = test::kvscope_exe();
  const std::string model =
      " --model " + test::stories_model_path() + " --tokenizer " + test::stories_tokenizer_path();
  const std::string res = test::source_dir() + "/resources/gates/";
  struct Case {
    const char* file;
    std::string policy;
    const char* gate;
    const char* budget_kind;
  };
  std::vector<Case> cases = {
      {"stories260K-wgkv.safetensors", "wgkv:gates=", "write_gate", "\"budget_kind\": \"none\""},
      {"stories260K-attention-gate.safetensors", "attention_gate:gates=", "keep_probability",
       "\"budget_kind\": \"none\""},
      {"stories260K-retention.safetensors", "trimkv:budget=32,gates=", "retention",
       "\"budget_kind\": \"head\""},
      {"stories260K-retention-global.safetensors", "dbtrimkv:budget=32,gates=", "retention",
       "\"budget_kind\": \"global\""},
      {"stories260K-dms.safetensors", "dms_learned:gates=", "dms_decision",
       "\"budget_kind\": \"none\""},
      // A DuoAttention pattern directory: no gate, the policy's spec names it.
      {"stories260K-duo-attention", "duo_attention:pattern=", "stories260K-duo-attention",
       "\"budget_kind\": \"none\""}};
  for (const Case& k : cases) {
    INFO(k.file);
    REQUIRE(std::filesystem::exists(res + k.file));
    const std::string trace = dir + "/shipped-" + k.file + ".kvtrace.h5";
    std::string out;
    const std::string capture =
        exe + " capture" + model +
        " --prompt 'Once upon a time, there was a little girl named Lily. She loved to play"
        " outside in the park with her friends.' --max-new 80 --prefill-chunk 512 -q --policy " +
        k.policy + res + k.file + " -o " + trace;
    REQUIRE(test::run_command(capture, &out) == 0);
    REQUIRE(test::run_command(exe + " info --check " + trace, &out) == 0);
    REQUIRE(test::run_command(exe + " info --json " + trace, &out) == 0);
    CHECK(out.find(k.gate) != std::string::npos);
    CHECK(out.find(k.budget_kind) != std::string::npos);
  }
}

TEST_CASE("the shipped SmolLM2 gate files fit SmolLM2 and drive a capture",
          "[gates][cli][resources]") {
  // The loader checks every tensor against the model: a file trained for
  // another shape would be refused with exit 2 before anything runs.
  const char* env = std::getenv("KVSCOPE_MODELS_DIR");
  const std::string models = env && *env ? env : test::source_dir() + "/models";
  const std::string model = models + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model))
    FAIL(
        "SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/fetch-models (or set "
        "KVSCOPE_MODELS_DIR)");
  const std::string dir = test::temp_dir(), exe = test::kvscope_exe();
  const std::string res = test::source_dir() + "/resources/gates/";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"wgkv:gates=" + res + "SmolLM2-135M-Instruct-wgkv.safetensors", "write_gate"},
      {"dbtrimkv:budget=16,gates=" + res + "SmolLM2-135M-Instruct-retention-global.safetensors",
       "retention"},
      {"trimkv:budget=16,gates=" + res + "SmolLM2-135M-Instruct-retention.safetensors",
       "retention"},
      {"attention_gate:gates=" + res + "SmolLM2-135M-Instruct-attention-gate.safetensors",
       "keep_probability"},
      {"duo_attention:sparsity=0.75,pattern=" + res + "SmolLM2-135M-Instruct-duo-attention",
       "SmolLM2-135M-Instruct-duo-attention"}};
  int n = 0;
  for (const auto& [policy, gate] : cases) {
    INFO(policy);
    const std::string trace = dir + "/smollm2-" + std::to_string(n++) + ".kvtrace.h5";
    std::string out;
    REQUIRE(
        test::run_command(exe + " capture --model " + model +
                              " --prompt 'The quick brown fox jumps over the lazy dog. It was a "
                              "sunny day in the park.' --max-new 4 --threads 2 -q --policy " +
                              policy + " -o " + trace,
                          &out) == 0);
    REQUIRE(test::run_command(exe + " info --json " + trace, &out) == 0);
    CHECK(out.find(gate) != std::string::npos);
  }
}
