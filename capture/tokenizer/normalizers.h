// Normalizers of tokenizer.json (formats.md 4.2, 4.6): Sequence, Prepend,
// Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip. Each rewrites one piece of
// text; the pipeline runs them on every piece between added tokens separately.
#pragma once

#include <memory>
#include <string>

#include "capture/tokenizer/json_fields.h"

namespace kvscope::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string* text) const = 0;
};

// nullptr for a JSON null; InputError naming `type` for unknown kinds.
std::unique_ptr<Normalizer> normalizer_from_json(const JsonAt& j);

// Building blocks the GGUF and llama2.c loaders also use.
std::unique_ptr<Normalizer> make_prepend(std::string prefix);
std::unique_ptr<Normalizer> make_replace(std::string from, std::string to);

}  // namespace kvscope::tokenizer
