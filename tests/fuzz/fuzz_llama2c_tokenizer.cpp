// libFuzzer target: llama2.c tokenizer.bin (capture/tokenizer/
// llama2c_tokenizer.cpp), read to the end of the file (vocab_size 0, as
// `--tokenizer` alone does) and with stories260K's 512 entries, then
// encode/decode of short texts.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "capture/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_tokenizer_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("tokenizer.bin");
  const std::string& path = file.write(data, size);
  for (int64_t vocab_size : {int64_t(0), int64_t(512)}) {
    std::unique_ptr<kvscope::tokenizer::Tokenizer> tok;
    if (kvscope::fuzz::accepts(
            [&] { tok = kvscope::tokenizer::Tokenizer::from_llama2c(path, vocab_size); }))
      kvscope::fuzz::exercise_tokenizer(*tok);
  }
  return 0;
}
