// Added and special tokens (formats.md 4.3, 3.10): found in the text before
// anything else, leftmost-longest, with the single_word / lstrip / rstrip
// rules of `tokenizers`; tokens marked `normalized` are matched against the
// normalized text in a second pass.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "capture/tokenizer/pre_tokenizers.h"

namespace kvscope::tokenizer {

class Normalizer;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
  // What decoding starts from: for normalized tokens the normalizer's output
  // (as `tokenizers` 0.23.3 does, so a decoder can invert that normalization),
  // otherwise the content. Set by AddedVocabulary.
  std::string decode_text;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalizer` (may be null) turns the contents of normalized tokens into
  // the patterns matched in normalized text.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Pass 1 on the raw text: pieces of raw text and non-normalized tokens.
  std::vector<Piece> split_raw(const std::string& text) const;
  // Pass 2 on one normalized piece: appends pieces and normalized tokens.
  void split_normalized(const Piece& piece, std::vector<Piece>* out) const;

  const AddedToken* find(int32_t id) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  // Leftmost-longest matcher over a set of strings, bucketed by first byte
  // (sets are small: tens to a few hundred tokens).
  struct Matcher {
    std::vector<std::string> patterns;
    std::vector<size_t> token_index;  // into tokens_
    std::vector<std::vector<size_t>> by_first_byte = std::vector<std::vector<size_t>>(256);
    void add(const std::string& pattern, size_t index);
    // Next match at or after `from`: (start, pattern index) or start = npos.
    std::pair<size_t, size_t> next(const std::string& s, size_t from) const;
  };
  void split(const std::string& text, bool at_origin, const Matcher& m,
             std::vector<Piece>* out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  Matcher raw_, normalized_;
};

}  // namespace kvscope::tokenizer
