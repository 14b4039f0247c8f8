// RULER's common words extraction (Hsieh et al., COLM 2024, task `cwe`;
// scripts/data/synthetic/common_words_extraction.py): a numbered list of
// words in which `top` words occur `freq` times each and every other word
// `rare` times; the question asks for the `top` most common — aggregation over
// the whole context, no single needle. Every occurrence of a common word is
// marked as the trace's needle (role 2), the question role 4. Success: the
// generation contains every common word (RULER's string_match_all).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct CweOptions {
  int64_t tokens = 1000;  // approximate prompt length in tokens
  int64_t top = 10;       // common words (RULER's num_cw), at most 50
  int64_t freq = 0;   // occurrences of each common word; 0: RULER's (6 below 4096 tokens, else 30)
  int64_t rare = 0;   // occurrences of each other word; 0: RULER's (1 below 4096 tokens, else 3)
  uint64_t seed = 1;  // the words and their order
  bool chat = false;
};

struct CweTask {
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::vector<std::string> answers;                       // the common words
  std::string answer;                                     // them joined by ", "
  int64_t list_entries = 0;                               // entries of the numbered list
  int64_t distinct_words = 0;                             // words in it, common and rare
  std::vector<std::pair<int64_t, int64_t>> needle_spans;  // each occurrence of a common word
  std::pair<int64_t, int64_t> question_span;
};

bool is_cwe_spec(const std::string& spec);
// "cwe:tokens=1000,top=10,freq=6,rare=1,seed=1" -> options (throws InputError
// naming the field). depth= is accepted and has no effect (sweep plans give
// every task one; the list is shuffled uniformly).
CweOptions parse_cwe_spec(const std::string& spec);
// The frequencies a spec's 0s stand for.
CweOptions resolve_cwe_defaults(CweOptions options);
// Throws InputError (field cwe:tokens) when `tokens` cannot hold the common
// words' occurrences and the question with this tokenizer.
CweTask make_cwe_task(const tokenizer::Tokenizer& tok, const CweOptions& options);

// The word list's own words (plain English nouns, verbs and adjectives, none
// inside another), before the generated ones that follow when a list needs more.
const std::vector<std::string>& cwe_builtin_words();

}  // namespace kvscope::tasks
