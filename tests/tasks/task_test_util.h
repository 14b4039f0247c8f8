// The two tokenizers the task tests run: stories260K's llama2.c tok512 and
// SmolLM2's GGUF byte-level BPE, each loaded once per test process.
#pragma once

#include <string>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::test {

// ../shared/models/stories260K (stories260K.bin, tok512.bin).
std::string stories_dir();
const tokenizer::Tokenizer& stories_tok();
// SmolLM2's tokenizer from the GGUF scripts/fetch-models puts in models/
// (KVSCOPE_MODELS_DIR overrides); the test fails, saying how to fetch it,
// when it is missing.
const tokenizer::Tokenizer& smol_tok();

}  // namespace kvscope::test
