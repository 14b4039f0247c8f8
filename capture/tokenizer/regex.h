// PCRE2 (UTF + UCP, JIT) behind a small interface, so pcre2.h stays private.
// find_all follows Oniguruma's find_iter, which Hugging Face `tokenizers`
// uses: leftmost-first alternation, and an empty match right where the
// previous match ended is skipped by advancing one character.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::tokenizer {

class Regex {
 public:
  // Throws std::invalid_argument carrying PCRE2's message and offset.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Byte ranges [start, end) of every match in s[0, n); s must be valid UTF-8.
  void find_all(const char* s, size_t n, std::vector<std::pair<size_t, size_t>>* out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace kvscope::tokenizer
