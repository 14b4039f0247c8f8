// Decoders of tokenizer.json (formats.md 4.6, 4.8): ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace and Sequence, applied as a chain over
// the list of token strings, exactly as `tokenizers` does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/json_fields.h"

namespace kvscope::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // `raw` is the per-token view (Tokenizer::token_bytes): bytes are kept as
  // bytes even when they are not valid UTF-8 on their own, and steps that
  // depend on a token's position in the text (Strip, Metaspace's first-token
  // rule) are skipped.
  virtual void decode_chain(std::vector<std::string>* tokens, bool raw) const = 0;
};

std::unique_ptr<Decoder> decoder_from_json(const JsonAt& j);

std::unique_ptr<Decoder> make_byte_level_decoder();
// Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", 1, 0): the Llama 2 chain.
std::unique_ptr<Decoder> make_sentencepiece_decoder(bool strip_leading_space);

}  // namespace kvscope::tokenizer
