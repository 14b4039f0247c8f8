// RULER's variable tracking (Hsieh et al., COLM 2024, task `vt`;
// scripts/data/synthetic/variable_tracking.py): chains of assignments
// "VAR QXKZB = 48213", "VAR MRTLA = VAR QXKZB", ... hidden in a haystack; the
// question gives the value and asks for every variable that holds it — a
// multi-hop trace through the context. With chains=C > 1 the other C - 1
// chains (other values) are distractors. The asked chain's statements are the
// trace's needle (role 2), the question role 4. Success: the generation names
// every variable of the asked chain (RULER's string_match_all).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tasks/haystack.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct VtOptions {
  int64_t tokens = 1000;  // approximate prompt length in tokens
  int64_t chains = 1;     // chains of assignments (the first is asked), at most 16
  int64_t hops = 4;       // assignments after the value: hops + 1 variables a chain, at most 32
  double depth = -1;      // where the asked chain starts, 0..1; < 0: anywhere (RULER)
  uint64_t seed = 1;      // names, values and places
  bool chat = false;
  HaystackOptions haystack;  // noise (RULER's) or text
};

struct VtTask {
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::string value;                 // the asked chain's value (5 digits)
  std::vector<std::string> answers;  // the asked chain's variables, in chain order
  std::string answer;                // them joined by ", "
  std::vector<std::pair<int64_t, int64_t>> needle_spans;  // each statement of the asked chain
  std::pair<int64_t, int64_t> question_span;
};

bool is_vt_spec(const std::string& spec);
// "vt:tokens=1000,chains=1,hops=4,depth=0.3,seed=1,haystack=noise" -> options
// (throws InputError naming the field).
VtOptions parse_vt_spec(const std::string& spec);
// Throws InputError (field vt:tokens) when `tokens` cannot hold the chains
// and the question with this tokenizer.
VtTask make_vt_task(const tokenizer::Tokenizer& tok, const VtOptions& options);

}  // namespace kvscope::tasks
