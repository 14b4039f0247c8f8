// Pre-tokenizers of tokenizer.json (formats.md 4.5, 4.6): Split (regex or
// string, five delimiter behaviours, invert), ByteLevel, Digits, Metaspace,
// Whitespace, WhitespaceSplit and Sequence. They cut the pieces between added
// tokens into the words the BPE model sees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/json_fields.h"

namespace kvscope::tokenizer {

// One piece of the input on its way through the pipeline. Pieces that are
// added tokens carry their id and are left alone by later stages.
struct Piece {
  std::string text;
  bool at_origin = false;  // starts at offset 0 of the original text (Metaspace "first")
  int32_t token = -1;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `pieces`; pieces with token >= 0 pass through untouched and
  // empty pieces are dropped, as in `tokenizers`.
  virtual void pre_tokenize(std::vector<Piece>* pieces) const = 0;
};

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const JsonAt& j);

// The regexes of formats.md 4.5 (verbatim), for the GGUF loader.
extern const char* const kGpt2Regex;
extern const char* const kLlama3Regex;
extern const char* const kQwen2Regex;

std::unique_ptr<PreTokenizer> make_split_isolated(const std::string& regex);
std::unique_ptr<PreTokenizer> make_byte_level(bool add_prefix_space, bool use_regex);
std::unique_ptr<PreTokenizer> make_digits(bool individual);
std::unique_ptr<PreTokenizer> make_sequence(std::vector<std::unique_ptr<PreTokenizer>> parts);

}  // namespace kvscope::tokenizer
