// Synthetic traces with known content for the view tests, written once per
// test into a fresh temporary directory.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/trace/synthetic.h"
#include "tests/support/paths.h"

namespace kvscope::test {

inline trace::SyntheticSpec small_spec() {
  trace::SyntheticSpec s;  // 4 layers, 8 heads, 4 kv heads, 48 + 32 tokens, window 16
  return s;
}

// 256 tokens in 4-token pooled blocks: a 64 x 64 map, three cached levels.
inline trace::SyntheticSpec lod_spec() {
  trace::SyntheticSpec s;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.prompt_tokens = 200;
  s.decode_steps = 56;
  s.prefill_chunk = 40;
  s.pooled_block = 4;
  s.tiers = 2;
  return s;
}

// SmolLM2-135M's shape (30 layers, 9 heads over 3 kv heads) on a 1K prompt.
inline trace::SyntheticSpec smollm2_like_spec() {
  trace::SyntheticSpec s;
  s.layers = 30;
  s.heads = 9;
  s.kv_heads = 3;
  s.prompt_tokens = 1000;
  s.decode_steps = 24;
  s.prefill_chunk = 250;
  s.window = 64;
  s.pooled_block = 16;
  s.tiers = 2;
  return s;
}

// A retrieval task's marks: `tokens` needle tokens from `begin`, and the last
// `question` prompt tokens.
inline trace::SyntheticSpec with_needle(trace::SyntheticSpec s, int64_t begin, int64_t tokens,
                                        int64_t question) {
  s.needle_begin = begin;
  s.needle_tokens = tokens;
  s.question_tokens = question;
  return s;
}

inline std::string write_trace(const trace::SyntheticSpec& spec, const std::string& name = "t.h5") {
  std::string path = temp_dir() + "/" + name;
  trace::write_synthetic_trace(path, spec);
  return path;
}

// A causal search's report beside the trace (TRACE.causal/causal.json, the
// shape of `kvscope why --causal`'s) for a model of this shape: every layer
// restored alone recovering a growing share, the minimal set the last
// layer's kv head 0, twelve replays.
inline void write_causal_report(const std::string& trace, int64_t layers, int64_t kv_heads) {
  nlohmann::json j = {{"n_layers", layers},
                      {"kv_heads", kv_heads},
                      {"replays", 12},
                      {"recoverable", true},
                      {"original", {{"logprob", -12.0}}},
                      {"full_restoration", {{"logprob", -1.0}}},
                      {"threshold_logprob", -2.1},
                      {"minimal_set", {std::to_string(layers - 1) + ".0"}},
                      {"words", "restoring the policy's losses in layer " +
                                    std::to_string(layers - 1) + " kv head 0 recovers the answer"}};
  j["heads"] = {{{"layer", layers - 1},
                 {"kv_head", 0},
                 {"restore_alone", {{"logprob", -1.5}}},
                 {"restore_trace", "replay-011.kvtrace.h5"}}};
  for (int64_t l = 0; l < layers; ++l)
    j["layers"].push_back(
        {{"layer", l},
         {"restore_alone", {{"logprob", -12.0 + 10.0 * double(l) / double(layers)}}},
         {"restore_trace", "replay-" + std::to_string(l) + ".kvtrace.h5"}});
  for (int i = 0; i < 12; ++i)
    j["replay_list"].push_back(
        {{"effect", {{"logprob", -12.0 + double(i)}}}, {"recovered", i >= 10}});
  std::filesystem::create_directories(trace + ".causal");
  std::ofstream(trace + ".causal/causal.json") << j.dump(1);
}

}  // namespace kvscope::test
