// The texts the tokenizer targets encode and decode with a loaded
// vocabulary: ASCII, digits, whitespace runs, multi-byte UTF-8, special-token
// look-alikes and a chat template.
#pragma once

#include <algorithm>
#include <vector>

#include "capture/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

namespace kvscope::fuzz {

inline void exercise_tokenizer(const tokenizer::Tokenizer& tok) {
  static const char* const texts[] = {
      "Hello world! 123 4567",
      "  leading spaces\tand\ttabs\n\nnewlines ",
      ("\xc3\xbcnic\xc3\xb6"  // split: 'd' would extend the hex escape
       "d\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82 \xe4\xb8\xad\xe6\x96\x87"),
      "<s></s><|im_start|>user<|im_end|><unk>",
      "a",
      ""};
  for (const char* text : texts) {
    std::vector<int32_t> ids;
    accepts([&] { ids = tok.encode(text, true); });
    accepts([&] { tok.decode(ids, false); });
    accepts([&] { tok.decode(ids, true); });
    tokenizer::StreamDecoder stream(tok);
    accepts([&] {
      for (int32_t id : ids) stream.push(id);
      stream.finish();
    });
  }
  const int64_t n = tok.vocab_size();
  for (int32_t id :
       {int32_t(-1), int32_t(0), int32_t(1), int32_t(n / 2), int32_t(n - 1), int32_t(n)}) {
    tok.token_bytes(id);
    tok.token_text(id);
    tok.is_special(id);
  }
  // Every id the vocabulary has must decode (ids beyond it are dropped).
  std::vector<int32_t> all;
  for (int64_t i = 0; i < std::min<int64_t>(n, 4096); ++i) all.push_back(int32_t(i));
  accepts([&] { tok.decode(all, false); });
  accepts([&] { tok.apply_chat_template({{"user", "Hi"}}, true); });
}

}  // namespace kvscope::fuzz
