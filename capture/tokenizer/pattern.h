// The "pattern" of Split pre-tokenizers and Replace normalizers/decoders: a
// literal string, a regex (PCRE2), or a per-character predicate. find_matches
// mirrors `tokenizers`: the pieces cover the whole input, each flagged as a
// match or not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/json_fields.h"
#include "capture/tokenizer/regex.h"

namespace kvscope::tokenizer {

struct Span {
  size_t start;
  size_t end;
  bool match;
};

class Pattern {
 public:
  static Pattern literal(std::string text);
  static Pattern regex(const std::string& pattern);  // throws std::invalid_argument
  static Pattern predicate(bool (*fn)(uint32_t));
  static Pattern character(uint32_t cp);
  // {"String": "..."} or {"Regex": "..."} as tokenizer.json writes them.
  static Pattern from_json(const JsonAt& j);

  std::vector<Span> find_matches(const std::string& s) const;
  // Every match replaced by `content`.
  std::string replace_all(const std::string& s, const std::string& content) const;

 private:
  enum class Kind { Literal, Regex, Predicate, Char } kind_ = Kind::Literal;
  std::string literal_;
  std::shared_ptr<Regex> regex_;
  bool (*predicate_)(uint32_t) = nullptr;
  uint32_t char_ = 0;
};

}  // namespace kvscope::tokenizer
