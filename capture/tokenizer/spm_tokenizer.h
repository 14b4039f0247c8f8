// SentencePiece-style vocabularies outside tokenizer.json: the GGUF `llama`
// model (llama.cpp's score-driven merge with resegmentation, formats.md 3.9)
// and llama2.c's tokenizer.bin (run.c's greedy highest-score merge, 5.3).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "capture/tokenizer/added_tokens.h"
#include "capture/tokenizer/decoders.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tokenizer {

// GGUF token types (formats.md 3.8).
enum GgufTokenType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct SpmVocab {
  std::vector<std::string> tokens;  // with U+2581 for spaces
  std::vector<float> scores;
  std::vector<int32_t> types;  // GgufTokenType
  int32_t bos = 1, eos = 2, unk = 0;
  bool add_bos = true, add_eos = false, add_space_prefix = true;
};

class SpmTokenizer : public Tokenizer {
 public:
  SpmTokenizer(SpmVocab vocab, std::string kind, std::string chat_template,
               std::vector<int32_t> eos_ids);

  std::vector<int32_t> encode(const std::string& text, bool add_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::string token_text(int32_t id) const override;
  int32_t token_to_id(const std::string& text) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(v_.tokens.size()); }
  bool is_special(int32_t id) const override;

 private:
  void tokenize_fragment(const std::string& text, std::vector<int32_t>* out) const;

  SpmVocab v_;
  std::unordered_map<std::string, int32_t> index_;
  int32_t byte_ids_[256];
  AddedVocabulary specials_;
  std::unique_ptr<Decoder> decoder_;
};

class Llama2cTokenizer : public Tokenizer {
 public:
  // Throws InputError naming the file and entry on truncated or bad data.
  Llama2cTokenizer(const std::string& path, int64_t vocab_size);

  std::vector<int32_t> encode(const std::string& text, bool add_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::string token_text(int32_t id) const override;
  int32_t token_to_id(const std::string& text) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  bool is_special(int32_t id) const override { return id >= 0 && id <= 2; }

 private:
  void merge(std::vector<int32_t>* ids) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> index_;
  int32_t byte_ids_[256];
  int32_t max_token_length_ = 0;
};

}  // namespace kvscope::tokenizer
