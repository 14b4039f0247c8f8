// libFuzzer target: tokenizer.json (capture/tokenizer/load_tokenizer_json.cpp
// and the normalizer, pre-tokenizer, model, post-processor and decoder
// readers behind it), then encode/decode of short texts with the loaded
// tokenizer.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "capture/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_tokenizer_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("tokenizer.json");
  const std::string& path = file.write(data, size);
  std::unique_ptr<kvscope::tokenizer::Tokenizer> tok;
  if (kvscope::fuzz::accepts(
          [&] { tok = kvscope::tokenizer::Tokenizer::from_tokenizer_json(path); }))
    kvscope::fuzz::exercise_tokenizer(*tok);
  return 0;
}
