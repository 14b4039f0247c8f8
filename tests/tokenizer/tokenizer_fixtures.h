// Shared by the tokenizer tests: the committed expectations and the
// tokenizer.json variants derived from committed files (the same JSON edits
// make_fixtures.py applies before asking `tokenizers` for expected ids).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::test {

std::string tokenizer_fixture_dir();
const nlohmann::json& tokenizer_expected();  // expected.json
// Loads the named tokenizer of expected.json: a committed directory or a
// variant written to a temp directory.
std::unique_ptr<tokenizer::Tokenizer> load_fixture_tokenizer(const std::string& name);
std::string smollm2_gguf_path();  // models/ (KVSCOPE_MODELS_DIR), fetched by scripts/fetch-models
std::string read_binary(const std::string& path);
void write_binary(const std::string& path, const std::string& data);

// A minimal GGUF v3 writer (metadata only, no tensors) for vocabularies.
class GgufMetadataWriter {
 public:
  void add_string(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, uint32_t value);
  void add_i64(const std::string& key, int64_t value);
  void add_bool(const std::string& key, bool value);
  void add_strings(const std::string& key, const std::vector<std::string>& values);
  void add_f32s(const std::string& key, const std::vector<float>& values);
  void add_i32s(const std::string& key, const std::vector<int32_t>& values);
  void write(const std::string& path) const;

 private:
  void key(const std::string& k, uint32_t type);
  void raw(const void* p, size_t n) { body_.append(static_cast<const char*>(p), n); }
  void str(const std::string& s);
  std::string body_;
  uint64_t count_ = 0;
};

// Llama 2's vocabulary from llama2.c's tokenizer.bin, as a GGUF `llama`
// tokenizer (pieces with U+2581, <s>/</s> restored, token types).
std::string write_llama2_gguf(const std::string& dir);

}  // namespace kvscope::test
