// RULER's needle-in-a-haystack with several keys (Hsieh et al., "RULER: What's
// the Real Context Size of Your Long-Context Language Models?", COLM 2024,
// tasks niah_single, niah_multikey and niah_multivalue): needles "One of the
// special magic numbers for <key> is: <value>." with distinct keys and 7-digit
// values, in RULER's noise haystack (the repeated sentences of the passkey
// task) or in real text (haystack=text, capture/tasks/haystack.h); the
// question asks for one key's value(s). keys=1 is the single-key task; with
// more keys the others are distractors spread evenly over the haystack — a
// policy must keep the right needle, not just any needle-like text.
// values=V > 1 is the multi-value task: the asked key has V values planted at
// V places, and the answer is all of them.
// queries=Q > 1 is the multi-query task: Q keys asked at once, the answer
// every value of each. value=uuid and key=uuid draw UUIDs instead of 7-digit
// numbers and nouns (RULER's niah_single_3, niah_multikey_3), and
// haystack=needle makes the haystack itself of needles with other keys
// (RULER's niah_multikey_2 and _3).
// The asked needles are marked as the trace's needle (role 2) and the question
// as role 4; distractor needles stay prompt text. Success: the generation
// contains every asked value (RULER's string_match_all).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tasks/haystack.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct NiahOptions {
  int64_t tokens = 1000;     // approximate prompt length in tokens
  int64_t keys = 4;          // needles (1: single-key), at most 16
  int64_t values = 1;        // values of each key (> 1: multi-value), at most 16
  int64_t queries = 1;       // keys asked at once (> 1: multi-query), at most `keys`
  double depth = 0.5;        // where the asked needle (its first value) sits, 0 (start) .. 1 (end)
  uint64_t seed = 1;         // picks keys, values and which key is asked
  bool uuid_values = false;  // value=uuid: RULER's "uuids" instead of 7-digit numbers
  bool uuid_keys = false;    // key=uuid: UUID keys instead of nouns
  bool chat = false;
  bool needle_haystack = false;  // haystack=needle: a haystack of needles with other keys
  HaystackOptions haystack;      // noise (default) or text
};

struct NiahTask {
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::string answer;                       // the asked key's value(s), joined by ", "
  std::vector<std::string> answers;         // the asked key's values
  std::string key;                          // the asked key (the first of them)
  std::pair<int64_t, int64_t> needle_span;  // token positions [begin, end) of the needle at `depth`
  std::vector<std::pair<int64_t, int64_t>> needle_spans;  // every asked needle's, in prompt order
  std::pair<int64_t, int64_t> question_span;
};

bool is_niah_spec(const std::string& spec);
// "niah:tokens=1000,keys=4,values=1,queries=1,depth=0.5,seed=1,haystack=noise,
// value=number,key=word" -> options (throws InputError naming the field).
NiahOptions parse_niah_spec(const std::string& spec);
// /run task_kind: niah_single, niah_multikey, niah_multivalue or niah_multiquery.
std::string niah_kind(const NiahOptions& options);
NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& options);

}  // namespace kvscope::tasks
