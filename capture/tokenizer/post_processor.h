// Post-processors of tokenizer.json (formats.md 4.7): TemplateProcessing
// (single-sequence template), BertProcessing / RobertaProcessing, ByteLevel
// (ids unchanged) and Sequence. They add BOS/EOS-like ids around the encoded
// text when special tokens are requested.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "capture/tokenizer/json_fields.h"

namespace kvscope::tokenizer {

class PostProcessor {
 public:
  // The ids the single-sequence template puts before and after the text.
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;

  void apply(std::vector<int32_t>* ids) const {
    ids->insert(ids->begin(), prefix.begin(), prefix.end());
    ids->insert(ids->end(), suffix.begin(), suffix.end());
  }
};

// nullptr for JSON null.
std::unique_ptr<PostProcessor> post_processor_from_json(const JsonAt& j);

}  // namespace kvscope::tokenizer
