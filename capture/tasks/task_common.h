// What the tasks share: their randomness (SplitMix64 from the seed, so the
// same spec gives the same prompt on every machine: std::*_distribution's
// output differs between standard libraries), the parsing of `name:key=value`
// specs with range-checked values, the token spans of marked text, and
// RULER's scoring of answers with several expected strings.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

// SplitMix64 (Steele, Lea & Flood 2014): the tasks' only randomness.
struct SplitMix {
  uint64_t state;
  uint64_t next();
  // A draw in [0, n) (n > 0; modulo bias below 2^-40 for the sizes used here).
  uint64_t below(uint64_t n) { return next() % n; }
  // Fisher-Yates shuffle, the same on every machine.
  template <class T>
  void shuffle(std::vector<T>* v) {
    for (size_t i = v->size(); i > 1; --i) std::swap((*v)[i - 1], (*v)[size_t(below(i))]);
  }
};

// A task spec "name[:key=value,...]" read key by key. Messages name the
// field as "name:key" and say what was expected, e.g.
//   --task: vt:hops: expected an integer in [1, 32], got '0'
class TaskSpec {
 public:
  // Throws InputError for a key not in `keys` (the message lists them).
  TaskSpec(const std::string& name, const std::string& spec, std::vector<std::string> keys);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi, int64_t fallback) const;
  double number(const std::string& key, double lo, double hi, double fallback) const;
  // One of `choices` (the message lists them).
  std::string choice(const std::string& key, const std::vector<std::string>& choices,
                     const std::string& fallback) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  // An InputError naming the field `name:key`.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::map<std::string, std::string> values_;
};

// Token spans [begin, end) of byte ranges [b, e) of `text`, given its
// encoding `ids`: the tokens that overlap each range (a token BPE merged
// across a boundary belongs to the span). The tokens' bytes are aligned with
// the text (a SentencePiece dummy-prefix space and special tokens that do not
// spell their text are allowed for); when they do not align (a normalizer
// changed the text), each span comes from the encodings of growing prefixes
// instead, one token wider at its start.
std::vector<std::pair<int64_t, int64_t>> token_spans(
    const tokenizer::Tokenizer& tok, const std::string& text, const std::vector<int32_t>& ids,
    const std::vector<std::pair<size_t, size_t>>& ranges);

// The same spans from the encodings of growing prefixes: [count(text[:b]) - 1,
// count(text[:e])), one token wider at the start whether or not BPE merged
// there (what needle, niah and defer have always recorded).
std::vector<std::pair<int64_t, int64_t>> prefix_token_spans(
    const tokenizer::Tokenizer& tok, const std::string& text,
    const std::vector<std::pair<size_t, size_t>>& ranges);

// A task's user message as the model reads it: inside the model's chat
// template, `offset` being where the message starts in it (found by its
// first words, `intro`), or as it is followed by `suffix` (offset 0). Byte
// ranges of the message move by `offset` into the prompt.
struct UserPrompt {
  std::string text;
  size_t offset = 0;
};
UserPrompt wrap_user_message(const tokenizer::Tokenizer& tok, bool chat, const std::string& user,
                             const std::string& intro, const std::string& suffix);

// RULER's string_match_all for one sample: how many of `expected` occur in
// `output` (ASCII case-insensitive substrings, as RULER lowercases both).
int64_t answers_found(const std::vector<std::string>& expected, const std::string& output);
// The share of them, 0..1 (1 when `expected` is empty).
double answer_score(const std::vector<std::string>& expected, const std::string& output);
// "a, b, c": the expected strings as one line (/run expected_answer).
std::string join_answers(const std::vector<std::string>& answers);

// The count n of haystack units (filler repetitions, words of text, list
// entries) whose prompt has about `target` tokens: starts from `n0`, then
// corrects by the measured count (`tokens_of(n)`, the prompt's token count
// with n units) over `per_unit` tokens a unit, a few rounds; returns the
// closest n seen (ties: the shorter prompt), at least `min_n`.
int64_t fit_units(int64_t target, int64_t n0, double per_unit, int64_t min_n,
                  const std::function<int64_t(int64_t)>& tokens_of);

}  // namespace kvscope::tasks
