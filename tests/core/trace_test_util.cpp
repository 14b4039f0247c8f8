#include "tests/core/trace_test_util.h"

#include <filesystem>

namespace kvscope::test {

trace::RunInfo tiny_run(int64_t layers, int64_t kv_heads) {
  trace::RunInfo run;
  run.model.name = "tiny";
  run.model.path = "tiny.bin";
  run.model.architecture = "llama";
  run.model.n_layers = layers;
  run.model.n_heads = 4;
  run.model.n_kv_heads = kv_heads;
  run.model.head_dim = 8;
  run.model.vocab_size = 100;
  run.model.context_length = 64;
  run.policy = run.policy_name = "test";
  run.policy_params_json = "{}";
  run.capture_levels = "events";
  return run;
}

trace::SyntheticSpec small_spec(int64_t tiers, int64_t prefill_chunk) {
  trace::SyntheticSpec spec;
  spec.layers = 3;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.prompt_tokens = 40;
  spec.decode_steps = 24;
  spec.prefill_chunk = prefill_chunk;
  spec.sinks = 2;
  spec.window = 8;
  spec.tiers = tiers;
  spec.pooled_block = 8;
  spec.topk = 3;
  spec.seed = 42;
  return spec;
}

std::string write_small_trace(const std::string& dir, const std::string& name, int64_t tiers,
                              int64_t prefill_chunk) {
  std::string path = dir + "/" + name;
  trace::write_synthetic_trace(path, small_spec(tiers, prefill_chunk));
  return path;
}

void copy_file(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

}  // namespace kvscope::test
