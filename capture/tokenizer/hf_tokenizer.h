// The Hugging Face `tokenizers` pipeline (formats.md 4.2): added tokens,
// normalizer, pre-tokenizer, BPE model, post-processor, and the decoder chain
// back to text. tokenizer.json and GGUF `gpt2` vocabularies both become one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/added_tokens.h"
#include "capture/tokenizer/bpe_model.h"
#include "capture/tokenizer/decoders.h"
#include "capture/tokenizer/normalizers.h"
#include "capture/tokenizer/post_processor.h"
#include "capture/tokenizer/pre_tokenizers.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tokenizer {

struct HfComponents {
  std::unique_ptr<BpeModel> model;
  std::vector<AddedToken> added;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
};

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(HfComponents parts, std::string kind);

  std::vector<int32_t> encode(const std::string& text, bool add_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string token_bytes(int32_t id) const override;
  std::string token_text(int32_t id) const override;
  int32_t token_to_id(const std::string& text) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  bool is_special(int32_t id) const override;

  const PostProcessor* post_processor() const { return parts_.post_processor.get(); }
  void set_bos(int32_t id) { bos_id_ = id; }
  void set_eos(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }

 private:
  // The string decoding starts from (added tokens: AddedToken::decode_text).
  const std::string* token_string(int32_t id) const;

  HfComponents parts_;
  AddedVocabulary added_;
  int64_t vocab_size_ = 0;
};

}  // namespace kvscope::tokenizer
