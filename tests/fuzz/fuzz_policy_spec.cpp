// libFuzzer target: policy specs `NAME:key=value,...` (capture/policy/
// params.h, registry.h): parsed against every registered policy's declared
// parameters, the policy built, and set up for stories260K's shape (gate
// files loaded, per-head state sized) without running a model. Path values
// (gates=, pattern=) are replaced by committed files chosen by the value.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "capture/policy/registry.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_model_shape.h"

namespace {

// Committed files a path parameter may point at: gate files for every kind
// (and the official checkpoints), head patterns, and a path that does not
// exist.
const std::vector<std::string>& gate_files() {
  static const std::vector<std::string> files = {
      KVSCOPE_FUZZ_GATES_DIR "/stories260K-wgkv.safetensors",
      KVSCOPE_FUZZ_GATES_DIR "/stories260K-attention-gate.safetensors",
      KVSCOPE_FUZZ_GATES_DIR "/stories260K-retention.safetensors",
      KVSCOPE_FUZZ_GATES_DIR "/stories260K-retention-global.safetensors",
      KVSCOPE_SOURCE_ROOT_DIR "/tests/fixtures/gates/wgkv_official.pt",
      KVSCOPE_SOURCE_ROOT_DIR "/tests/fixtures/gates/trimkv",
      KVSCOPE_FUZZ_FIXTURES_DIR "/missing"};
  return files;
}

const std::vector<std::string>& pattern_files() {
  static const std::vector<std::string> files = {
      KVSCOPE_FUZZ_FIXTURES_DIR "/duo/full_attention_heads.tsv", KVSCOPE_FUZZ_FIXTURES_DIR "/duo",
      KVSCOPE_FUZZ_FIXTURES_DIR "/missing"};
  return files;
}

// A committed file for a path value: the one whose name holds "-VALUE." or
// "/VALUE" (so seeds can say gates=wgkv), else one chosen by the value.
const std::string& committed_file(const std::vector<std::string>& files, const std::string& value) {
  for (const std::string& f : files) {
    if (value.empty()) break;
    const bool kind = f.find("-" + value + ".") != std::string::npos;
    const bool base = f.size() > value.size() &&
                      f.compare(f.size() - value.size() - 1, std::string::npos, "/" + value) == 0;
    if (kind || base) return f;
  }
  return files[std::hash<std::string>()(value) % files.size()];
}

// The spec with its path parameters (gates=, pattern=) pointing at committed
// files, so an input never names an arbitrary path (a FIFO, /dev/zero).
std::string with_committed_paths(const std::string& spec) {
  std::string name;
  std::map<std::string, std::string> values;
  kvscope::policy::parse_policy_spec(spec, &name, &values);
  if (!values.count("gates") && !values.count("pattern")) return spec;
  std::string out = name + ":";
  for (const auto& [k, v] : values) {
    if (out.back() != ':') out += ",";
    out += k + "=";
    if (k == "gates")
      out += committed_file(gate_files(), v);
    else if (k == "pattern")
      out += committed_file(pattern_files(), v);
    else
      out += v;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kvscope::model::ModelConfig model = kvscope::fuzz::stories260k_config();
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string spec;
  if (!kvscope::fuzz::accepts([&] { spec = with_committed_paths(input); })) return 0;
  kvscope::fuzz::accepts([&] {
    kvscope::policy::PolicyInstance p = kvscope::policy::make_policy(spec);
    p.params.to_json();
    kvscope::policy::PolicySetup setup;
    setup.model = &model;
    setup.max_tokens = 256;
    setup.prompt_tokens = 64;
    p.policy->setup(setup);
    p.policy->tiers();
    p.policy->reason_names();
    p.policy->gates();
    p.policy->budget();
  });
  return 0;
}
