// RULER's needle-in-a-haystack with several keys (Hsieh et al., "RULER: What's
// the Real Context Size of Your Long-Context Language Models?", COLM 2024,
// tasks niah_single and niah_multikey): needles "One of the special magic
// numbers for <key> is: <value>." with distinct keys and 7-digit values, in
// RULER's noise haystack (the repeated sentences of the passkey task); the
// question asks for one key's value. keys=1 is the single-key task; with more
// keys the others are distractors spread evenly over the haystack — a policy
// must keep the right needle, not just any needle-like text.
// The asked needle is marked as the trace's needle (role 2) and the question
// as role 4; distractor needles stay prompt text. Success: the generation
// contains the asked value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct NiahOptions {
  int64_t tokens = 1000;  // approximate prompt length in tokens
  int64_t keys = 4;       // needles (1: single-key), at most 16
  double depth = 0.5;     // where the asked needle sits, 0 (start) .. 1 (end)
  uint64_t seed = 1;      // picks keys, values and which key is asked
  bool chat = false;
};

struct NiahTask {
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::string answer;                       // the asked key's value
  std::string key;                          // the asked key
  std::pair<int64_t, int64_t> needle_span;  // the asked needle's token positions [begin, end)
  std::pair<int64_t, int64_t> question_span;
};

bool is_niah_spec(const std::string& spec);
// "niah:tokens=1000,keys=4,depth=0.5,seed=1" -> options (throws InputError).
NiahOptions parse_niah_spec(const std::string& spec);
NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& options);

}  // namespace kvscope::tasks
