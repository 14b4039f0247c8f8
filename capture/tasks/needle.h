// The needle-in-a-haystack task of KVScope's demo and benchmarks: passkey
// retrieval (Mohtashami & Jaggi, "Landmark Attention", 2023): a number planted
// at a chosen depth of repetitive filler text, asked for at the end. Filler
// that carries no information is the point: a policy keeps the needle only if
// its scores single it out.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct NeedleOptions {
  int64_t tokens = 1000;  // approximate prompt length in tokens
  double depth = 0.5;     // where the needle sits, 0 (start) .. 1 (end of the filler)
  uint64_t seed = 1;      // picks the passkey
  bool chat = false;      // wrap in the tokenizer's chat template
};

struct NeedleTask {
  std::string prompt_text;  // what the model reads (template included)
  std::vector<int32_t> ids;
  std::string answer;       // the passkey digits
  std::pair<int64_t, int64_t> needle_span;    // token positions [begin, end)
  std::pair<int64_t, int64_t> question_span;
};

// The five-digit pass key of a seed, and the filler sentence around it
// (shared with the deferred-salience task, capture/tasks/defer.h).
std::string passkey(uint64_t seed);
extern const char* const kPasskeyFiller;

// "needle:tokens=1000,depth=0.5,seed=1" -> options (throws InputError).
NeedleOptions parse_needle_spec(const std::string& spec);
NeedleTask make_needle_task(const tokenizer::Tokenizer& tok, const NeedleOptions& options);

}  // namespace kvscope::tasks
