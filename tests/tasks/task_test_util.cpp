#include "tests/tasks/task_test_util.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "tests/support/paths.h"

namespace kvscope::test {

std::string stories_dir() {
  return shared_dir() + "/models/stories260K";
}

const tokenizer::Tokenizer& stories_tok() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok =
      tokenizer::Tokenizer::load(stories_dir() + "/tok512.bin", 512);
  return *tok;
}

const tokenizer::Tokenizer& smol_tok() {
  static std::unique_ptr<tokenizer::Tokenizer> tok;
  if (!tok) {
    const char* env = std::getenv("KVSCOPE_MODELS_DIR");
    const std::string path = (env && *env ? env : source_dir() + "/models") +
                             std::string("/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!std::filesystem::exists(path))
      FAIL(path + " is missing: run scripts/fetch-models (or set KVSCOPE_MODELS_DIR)");
    tok = tokenizer::Tokenizer::load(path);
  }
  return *tok;
}

}  // namespace kvscope::test
