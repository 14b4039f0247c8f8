// Bad input: each a clear InputError naming the file and the field.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <random>

#include "capture/formats/gguf.h"
#include "capture/tokenizer/tokenizer.h"
#include "capture/tokenizer/unicode.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"
#include "tokenizer_fixtures.h"

using kvscope::InputError;
using kvscope::test::temp_dir;
using kvscope::test::write_binary;
using kvscope::tokenizer::Tokenizer;

namespace {

// The message of the InputError that loading `json_text` as tokenizer.json throws.
std::string json_error(const std::string& json_text, std::string* path_out = nullptr) {
  static int counter = 0;
  std::string path = temp_dir() + "/bad" + std::to_string(counter++) + ".json";
  write_binary(path, json_text);
  if (path_out) *path_out = path;
  try {
    Tokenizer::from_tokenizer_json(path);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("no InputError for " << json_text);
  return {};
}

const char* const kSmallModel =
    R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [%MERGES%]})";

std::string small_json(const std::string& merges, const std::string& extra = "") {
  std::string m = kSmallModel;
  m.replace(m.find("%MERGES%"), 8, merges);
  return "{" + extra + m + "}";
}

}  // namespace

TEST_CASE("tokenizer.json with an unknown model type names model.type", "[tokenizer][errors]") {
  std::string path;
  std::string msg = json_error(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})", &path);
  CHECK_THAT(msg, Catch::Contains(path));
  CHECK_THAT(msg, Catch::Contains("model.type"));
  CHECK_THAT(msg, Catch::Contains("WordPiece"));
  CHECK_THAT(msg, Catch::Contains("supported: BPE"));
}

TEST_CASE("malformed tokenizer.json is an InputError naming the file", "[tokenizer][errors]") {
  std::string path;
  std::string msg = json_error(R"({"model": {"type": "BPE", "vocab": {"a": 0},)", &path);
  CHECK_THAT(msg, Catch::Contains(path));
  CHECK_THAT(msg, Catch::Contains("malformed JSON"));
  CHECK_THAT(json_error("[1, 2]"), Catch::Contains("object"));
  CHECK_THAT(json_error(R"({"model": null})"), Catch::Contains("model"));
  CHECK_THROWS_AS(Tokenizer::from_tokenizer_json(temp_dir() + "/missing.json"), InputError);
}

TEST_CASE("merges referencing unknown tokens name the merge", "[tokenizer][errors]") {
  // Sanity: the small model loads and merges when its merges are right.
  std::string ok = temp_dir() + "/ok.json";
  write_binary(ok, small_json(R"("a b")"));
  CHECK(Tokenizer::from_tokenizer_json(ok)->encode("ab", false) == std::vector<int32_t>{2});

  std::string msg = json_error(small_json(R"("a b", "a c")"));
  CHECK_THAT(msg, Catch::Contains("model.merges[1]"));
  CHECK_THAT(msg, Catch::Contains("\"c\""));
  CHECK_THAT(json_error(small_json(R"(["b", "b"])")), Catch::Contains("\"bb\""));
  CHECK_THAT(json_error(small_json(R"("a b c")")), Catch::Contains("model.merges[0]"));
  CHECK_THAT(json_error(small_json(R"(7)")), Catch::Contains("model.merges[0]"));
}

TEST_CASE("unknown pipeline components name their field", "[tokenizer][errors]") {
  CHECK_THAT(
      json_error(small_json(
          "", R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Bogus"}]},)")),
      Catch::Contains("pre_tokenizer.pretokenizers[0].type"));
  CHECK_THAT(json_error(small_json("", R"("normalizer": {"type": "Precompiled"},)")),
             Catch::Contains("normalizer.type"));
  CHECK_THAT(json_error(small_json("", R"("decoder": {"type": "WordPiece"},)")),
             Catch::Contains("decoder.type"));
  CHECK_THAT(
      json_error(small_json(
          "",
          R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"},)")),
      Catch::Contains("pre_tokenizer.pattern.Regex"));
  CHECK_THAT(
      json_error(small_json(
          "",
          R"("post_processor": {"type": "BertProcessing", "sep": ["[SEP]"], "cls": ["[CLS]", 0]},)")),
      Catch::Contains("post_processor.cls") || Catch::Contains("post_processor.sep"));
  CHECK_THAT(
      json_error(small_json(
          "",
          R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}], "special_tokens": {}},)")),
      Catch::Contains("post_processor.single[0].SpecialToken.id"));
  CHECK_THAT(json_error(small_json("", R"("added_tokens": [{"content": "x"}],)")),
             Catch::Contains("added_tokens[0].id"));
}

TEST_CASE("truncated or malformed tokenizer.bin is an InputError", "[tokenizer][errors]") {
  const std::string full =
      kvscope::test::read_binary(kvscope::test::shared_dir() + "/models/stories260K/tok512.bin");
  std::string path = temp_dir() + "/truncated.bin";
  write_binary(path, full.substr(0, full.size() / 2));
  try {
    Tokenizer::from_llama2c(path, 512);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path));
    CHECK_THAT(e.what(), Catch::Contains("truncated"));
    CHECK_THAT(e.field(), Catch::StartsWith("token "));
  }
  // Reading to the end of the file needs the file to end after a whole entry.
  write_binary(path, full.substr(0, full.size() - 1));
  CHECK_THROWS_AS(Tokenizer::from_llama2c(path, 0), InputError);
  write_binary(path, full.substr(0, 2));
  CHECK_THROWS_AS(Tokenizer::from_llama2c(path, 512), InputError);
  // A negative length.
  std::string bad = full;
  int32_t neg = -5;
  std::memcpy(&bad[8], &neg, 4);
  write_binary(path, bad);
  CHECK_THROWS_WITH(Tokenizer::from_llama2c(path, 512), Catch::Contains("token 0 length"));
}

// Fuzzing finding (tests/fuzz/regressions/llama2c_tokenizer): encode fell
// back to run.c's byte ids 3..258 in a vocabulary without them and read past
// the pieces.
TEST_CASE("tokenizer.bin without the byte tokens of the fallback is an InputError",
          "[tokenizer][errors]") {
  std::string data(4, '\0');
  const int32_t max_len = 8;
  std::memcpy(&data[0], &max_len, 4);
  for (const char* piece : {"<unk>", "<s>", "</s>", "a"}) {
    const float score = 0;
    const int32_t len = int32_t(std::strlen(piece));
    data.append(reinterpret_cast<const char*>(&score), 4);
    data.append(reinterpret_cast<const char*>(&len), 4);
    data += piece;
  }
  const std::string path = temp_dir() + "/no-bytes.bin";
  write_binary(path, data);
  try {
    Tokenizer::from_llama2c(path, 0);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.field() == "vocab_size");
    CHECK_THAT(e.what(), Catch::Contains(path));
    CHECK_THAT(e.what(), Catch::Contains("4 entries and no piece <0x01>"));
    CHECK_THAT(e.what(), Catch::Contains("ids 3..258"));
  }
}

TEST_CASE("text that is not UTF-8 is rejected by encode", "[tokenizer][errors]") {
  auto tok = kvscope::test::load_fixture_tokenizer("smollm2");
  auto bin =
      Tokenizer::from_llama2c(kvscope::test::shared_dir() + "/models/stories260K/tok512.bin", 512);
  for (const std::string& bad :
       {std::string("\xC3\x28"), std::string("ok \xED\xA0\x80 surrogate"),
        std::string("\xC0\xAF overlong"), std::string("\xF8\x88\x80\x80\x80"),
        std::string("cut \xE2\x82"), std::string("\xFF"), std::string("\xF4\x90\x80\x80")}) {
    INFO("bytes: " << bad);
    CHECK_THROWS_AS(tok->encode(bad), InputError);
    CHECK_THROWS_AS(bin->encode(bad), InputError);
    try {
      tok->encode(bad);
    } catch (const InputError& e) {
      CHECK(e.field() == "text");
      CHECK_THAT(e.what(), Catch::Contains("invalid UTF-8 at byte"));
    }
  }
}

TEST_CASE("GGUF without a supported tokenizer names the key", "[tokenizer][errors]") {
  kvscope::test::GgufMetadataWriter w;
  w.add_string("general.architecture", "bert");
  w.add_string("tokenizer.ggml.model", "bert");
  std::string path = temp_dir() + "/bert.gguf";
  w.write(path);
  kvscope::formats::GgufFile gguf(path);
  CHECK_THROWS_WITH(Tokenizer::from_gguf(gguf),
                    Catch::Contains("tokenizer.ggml.model") && Catch::Contains("gpt2, llama"));

  kvscope::test::GgufMetadataWriter w2;
  w2.add_string("tokenizer.ggml.model", "gpt2");
  w2.add_string("tokenizer.ggml.pre", "mystery");
  w2.add_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w2.add_strings("tokenizer.ggml.merges", {"a b"});
  std::string path2 = temp_dir() + "/mystery.gguf";
  w2.write(path2);
  kvscope::formats::GgufFile gguf2(path2);
  CHECK_THROWS_WITH(Tokenizer::from_gguf(gguf2),
                    Catch::Contains("tokenizer.ggml.pre") && Catch::Contains("mystery"));

  kvscope::test::GgufMetadataWriter w3;
  w3.add_string("tokenizer.ggml.model", "gpt2");
  w3.add_strings("tokenizer.ggml.tokens", {"a", "b"});
  w3.add_strings("tokenizer.ggml.merges", {"a b"});
  std::string path3 = temp_dir() + "/badmerge.gguf";
  w3.write(path3);
  kvscope::formats::GgufFile gguf3(path3);
  CHECK_THROWS_WITH(Tokenizer::from_gguf(gguf3), Catch::Contains("tokenizer.ggml.merges[0]"));
}

TEST_CASE("out-of-range integers in tokenizer.json and GGUF vocabularies name the field",
          "[tokenizer][errors]") {
  // 2^32 + 248 used to become id 248 (the low 32 bits).
  CHECK_THAT(json_error(small_json("", R"("added_tokens": [{"id": 4294967544, "content": "x"}],)")),
             Catch::Contains("added_tokens[0].id") && Catch::Contains("4294967544") &&
                 Catch::Contains("[0, 2147483647]"));
  CHECK_THAT(json_error(small_json(
                 "", R"("post_processor": {"type": "BertProcessing", "cls": ["a", 4294967296],
                        "sep": ["b", 1]},)")),
             Catch::Contains("post_processor.cls[1]") && Catch::Contains("4294967296"));
  CHECK_THAT(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 18446744073709551615},
                            "merges": []}})"),
             Catch::Contains("model.vocab[\"a\"]") && Catch::Contains("18446744073709551615"));

  auto gguf_error = [](const std::function<void(kvscope::test::GgufMetadataWriter&)>& add) {
    kvscope::test::GgufMetadataWriter w;
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
    add(w);
    static int n = 0;
    const std::string path = temp_dir() + "/range" + std::to_string(n++) + ".gguf";
    w.write(path);
    try {
      Tokenizer::from_gguf(kvscope::formats::GgufFile(path));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  // -4294967048 truncated to 32 bits is 248.
  CHECK_THAT(gguf_error([](auto& w) { w.add_i64("tokenizer.ggml.eos_token_id", -4294967048); }),
             Catch::Contains("tokenizer.ggml.eos_token_id") && Catch::Contains("-4294967048"));
  CHECK_THAT(gguf_error([](auto& w) { w.add_i64("tokenizer.ggml.bos_token_id", 4294967297); }),
             Catch::Contains("tokenizer.ggml.bos_token_id") &&
                 Catch::Contains("outside the vocabulary of 4"));
  CHECK_THAT(gguf_error([](auto& w) {
               w.add_i32s("tokenizer.ggml.token_type", {1, 1, 1, 99});
             }),
             Catch::Contains("tokenizer.ggml.token_type[3]") && Catch::Contains("0..6"));
}

// Fuzzing finding (tests/fuzz/regressions/tokenizer_json): nlohmann's
// out_of_range for a number no double holds escaped the parse (terminate).
TEST_CASE("tokenizer.json with a number beyond double range is malformed JSON",
          "[tokenizer][errors]") {
  CHECK_THAT(json_error(R"({"model": {"type": "BPE", "dropout": 1e400}})"),
             Catch::Contains("malformed JSON") && Catch::Contains("1e400"));
}

// Fuzzing findings (tests/fuzz/regressions/tokenizer_json): an unk_token
// missing from the vocabulary threw std::runtime_error at encode time (exit
// 1), and one large id sized the id tables (2^31 - 1: 64 GB).
TEST_CASE("BPE: a missing unk_token and ids beyond the id tables are InputErrors",
          "[tokenizer][errors]") {
  std::string path;
  const std::string missing_unk =
      R"({"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0, "b": 1}, "merges": []}})";
  write_binary(path = temp_dir() + "/unk.json", missing_unk);
  auto tok = Tokenizer::from_tokenizer_json(path);
  CHECK(tok->encode("ab", false) == std::vector<int32_t>{0, 1});
  try {
    tok->encode("abz", false);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.field() == "model.unk_token");
    CHECK_THAT(e.what(),
               Catch::Contains(path) && Catch::Contains("\"<unk>\" is not in the vocabulary"));
  }
  CHECK_THAT(json_error(R"({"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}})"),
             Catch::Contains("vocab[\"a\"]") && Catch::Contains("[0, 16777215]"));
}

namespace {

// Replaces one random node of `j` by a value of another JSON type.
void mutate(nlohmann::json& j, std::mt19937& rng) {
  nlohmann::json* node = &j;
  for (int depth = 0; depth < 6; ++depth) {
    if (node->is_object() && !node->empty()) {
      auto it = node->begin();
      std::advance(it, static_cast<long>(rng() % node->size()));
      if (rng() % 3 == 0) break;
      node = &it.value();
    } else if (node->is_array() && !node->empty()) {
      node = &(*node)[rng() % node->size()];
    } else {
      break;
    }
  }
  static const nlohmann::json replacements[] = {nullptr,
                                                7,
                                                -1,
                                                3.5,
                                                "x",
                                                "Bogus",
                                                true,
                                                nlohmann::json::array(),
                                                nlohmann::json::object(),
                                                nlohmann::json::array({1, "a"})};
  *node = replacements[rng() % (sizeof(replacements) / sizeof(*replacements))];
}

}  // namespace

TEST_CASE("mutated tokenizer.json files load or give InputError, never crash",
          "[tokenizer][errors]") {
  const std::string text = kvscope::test::read_binary(kvscope::test::tokenizer_fixture_dir() +
                                                      "/llama3_bpe/tokenizer.json");
  const auto original = nlohmann::json::parse(text);
  std::mt19937 rng(11);
  int loaded = 0, rejected = 0;
  const std::string path = temp_dir() + "/mutated.json";
  for (int i = 0; i < 300; ++i) {
    std::string data;
    if (i % 3 == 0) {
      data = text.substr(0, rng() % text.size());  // truncated
    } else {
      nlohmann::json j = original;
      for (int k = 0; k <= i % 4; ++k) mutate(j, rng);
      data = j.dump();
    }
    write_binary(path, data);
    try {
      auto tok = Tokenizer::from_tokenizer_json(path);
      tok->decode(tok->encode("Hello <mask> world 123 \xE4\xB8\xAD", true));
      ++loaded;
    } catch (const InputError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 100);
  CHECK(loaded > 10);
}

TEST_CASE("truncated tokenizer.bin files give InputError at every length", "[tokenizer][errors]") {
  const std::string full =
      kvscope::test::read_binary(kvscope::test::shared_dir() + "/models/stories260K/tok512.bin");
  const std::string path = temp_dir() + "/cut.bin";
  for (size_t n = 0; n < full.size(); n += 37) {
    write_binary(path, full.substr(0, n));
    CHECK_THROWS_AS(Tokenizer::from_llama2c(path, 512), InputError);
  }
}

TEST_CASE("byte-level BPE round-trips random Unicode text exactly", "[tokenizer]") {
  auto tok = kvscope::test::load_fixture_tokenizer("smollm2");
  std::mt19937 rng(5);
  for (int t = 0; t < 300; ++t) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) {
      const uint32_t kind = rng() % 4;
      uint32_t cp;
      if (kind == 0) {
        cp = 0x20 + rng() % 0x5F;  // ASCII
      } else if (kind == 1) {
        cp = rng() % 0x20 == 0 ? 0x0A : 0x20;  // spaces, newlines
      } else if (kind == 2) {
        cp = 0x80 + rng() % 0x3000;  // Latin to CJK punctuation
      } else {
        // Supplementary planes whose UTF-8 lead byte (F0, F3) is in the vocabulary: SmolLM2
        // has no token for 21 bytes (among them F1, F2), which `tokenizers` silently drops.
        cp = rng() % 2 ? 0x10000 + rng() % 0x30000 : 0xC0000 + rng() % 0x40000;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
      kvscope::tokenizer::unicode::append(&text, cp);
    }
    if (rng() % 5 == 0) {  // a special token in the middle, at a character boundary
      size_t at = text.size() / 2;
      while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
      text.insert(at, "<|im_end|>");
    }
    INFO("text: " << text);
    CHECK(tok->decode(tok->encode(text, false)) == text);
  }
}
