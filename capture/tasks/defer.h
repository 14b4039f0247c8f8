// The deferred-salience task (seed 004's DEFER-Bench idea): a fact planted
// early in the prompt that becomes necessary only in the final answer, with
// distractor traffic in between. Unlike the needle task, the distractors are
// not prompt: they are teacher-forced decode steps fed one per step as if the
// model had written them, so the policy runs on every one of them and the fact
// must survive D steps of decode-time decisions before the forced question
// asks for it and the model generates the answer.
//
// Prompt: an instruction, filler with a five-digit pass key at `depth` (the
// needle, marked TokenRole::Needle), and a request to write a story first.
// Forced: `distract` tokens of varied prose without digits (deterministic
// from the seed), then the question ending in "The pass key is" (marked
// TokenRole::Question). Then free generation; success = the answer contains
// the key.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct DeferOptions {
  int64_t tokens = 1000;  // approximate prompt length in tokens
  int64_t distract = 64;  // forced distractor tokens fed as decode steps
  double depth = 0.1;     // where the fact sits, 0 (start) .. 1 (end of the filler)
  uint64_t seed = 1;      // picks the pass key and the distractor prose
  bool chat = false;      // wrap the prompt in the tokenizer's chat template
};

struct DeferTask {
  std::string prompt_text;        // what the model reads before decoding (template included)
  std::vector<int32_t> ids;       // the prompt's ids
  std::vector<int32_t> forced;    // distractor ids, then the question's, fed as decode steps
  int64_t distractor_tokens = 0;  // the first ids of `forced`
  std::string answer;             // the pass key digits
  std::pair<int64_t, int64_t> needle_span;    // token positions [begin, end) in the prompt
  std::pair<int64_t, int64_t> question_span;  // positions of the forced question
};

// True when `spec` names this task ("defer" or "defer:...").
bool is_defer_spec(const std::string& spec);
// "defer:tokens=1000,distract=64,seed=1,depth=0.1" -> options (throws InputError
// naming the field).
DeferOptions parse_defer_spec(const std::string& spec);
// Throws InputError (field defer:tokens) when `tokens` leaves no room for the
// fact, the instructions and one filler sentence with this tokenizer.
DeferTask make_defer_task(const tokenizer::Tokenizer& tok, const DeferOptions& options);

// The distractor prose of a seed: whole sentences of plain story text, no
// digits, at least `min_chars` bytes long.
std::string defer_distractor_text(uint64_t seed, size_t min_chars);

}  // namespace kvscope::tasks
