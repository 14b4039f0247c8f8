#include "tokenizer_fixtures.h"

#include <sys/stat.h>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  return json::parse(read_binary(path));
}

// Mirrors of make_fixtures.py's VARIANTS.
void variant_smollm2_digits(json& d) {
  d["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}, {"individual_digits", true}}, d["pre_tokenizer"]})}};
}

void variant_llama2_legacy(json& d) {
  d["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array(
           {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}};
  d["pre_tokenizer"] = nullptr;
  json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  d["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  d["model"]["unk_token"] = "<unk>";
}

void variant_llama2_metaspace(json& d) {
  json m = {{"type", "Metaspace"},
            {"replacement", "\xE2\x96\x81"},
            {"prepend_scheme", "always"},
            {"split", true}};
  d["pre_tokenizer"] = m;
  d["decoder"] = m;
}

void variant_llama3_misc(json& d) {
  d["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "NFKC"}},
                    {{"type", "Lowercase"}},
                    {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}})}};
  d["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Whitespace"}},
                    {{"type", "Split"},
                     {"pattern", {{"String", "-"}}},
                     {"behavior", "MergedWithPrevious"},
                     {"invert", false}},
                    {{"type", "Split"},
                     {"pattern", {{"Regex", "[.,;:!?]"}}},
                     {"behavior", "MergedWithNext"},
                     {"invert", false}},
                    {{"type", "Digits"}, {"individual_digits", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}})}};
  d["post_processor"] = {{"type", "BertProcessing"},
                         {"sep", {"<|end_of_text|>", 1}},
                         {"cls", {"<|begin_of_text|>", 0}}};
}

void variant_qwen2_misc(json& d) {
  d["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "NFD"}},
                    {{"type", "Replace"}, {"pattern", {{"Regex", "\\p{Mn}"}}}, {"content", ""}},
                    {{"type", "NFKD"}}})}};
  d["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "WhitespaceSplit"}},
                    {{"type", "Split"},
                     {"pattern", {{"String", "q"}}},
                     {"behavior", "Removed"},
                     {"invert", false}},
                    {{"type", "Split"},
                     {"pattern", {{"Regex", "[aeiou]+"}}},
                     {"behavior", "Contiguous"},
                     {"invert", false}},
                    {{"type", "Split"},
                     {"pattern", {{"Regex", "[xyz]"}}},
                     {"behavior", "MergedWithPrevious"},
                     {"invert", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  d["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "ByteLevel"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 2}, {"stop", 0}}})}};
  d["post_processor"] = {
      {"type", "RobertaProcessing"}, {"sep", {"<|im_end|>", 2}}, {"cls", {"<|im_start|>", 1}}};
}

}  // namespace

std::string tokenizer_fixture_dir() {
  return source_dir() + "/tests/fixtures/tokenizer";
}

const json& tokenizer_expected() {
  static const json expected = read_json(tokenizer_fixture_dir() + "/expected.json");
  return expected;
}

std::unique_ptr<tokenizer::Tokenizer> load_fixture_tokenizer(const std::string& name) {
  struct Variant {
    const char* name;
    const char* base;
    void (*edit)(json&);
  };
  static const Variant variants[] = {{"smollm2_digits", "smollm2", variant_smollm2_digits},
                                     {"llama2_legacy", "llama2", variant_llama2_legacy},
                                     {"llama2_metaspace", "llama2", variant_llama2_metaspace},
                                     {"llama3_misc", "llama3_bpe", variant_llama3_misc},
                                     {"qwen2_misc", "qwen2_bpe", variant_qwen2_misc}};
  for (const Variant& v : variants) {
    if (name != v.name) continue;
    json d = read_json(tokenizer_fixture_dir() + "/" + v.base + "/tokenizer.json");
    v.edit(d);
    std::string dir = temp_dir() + "/" + name;
    mkdir(dir.c_str(), 0755);
    write_binary(dir + "/tokenizer.json", d.dump());
    return tokenizer::Tokenizer::load(dir);
  }
  return tokenizer::Tokenizer::load(tokenizer_fixture_dir() + "/" + name);
}

std::string smollm2_gguf_path() {
  const char* env = std::getenv("KVSCOPE_MODELS_DIR");
  std::string dir = env && *env ? env : source_dir() + "/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string read_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot open " + path + " (scripts/fetch-models provides models/)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_binary(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void GgufMetadataWriter::str(const std::string& s) {
  uint64_t n = s.size();
  raw(&n, 8);
  body_ += s;
}

void GgufMetadataWriter::key(const std::string& k, uint32_t type) {
  str(k);
  raw(&type, 4);
  ++count_;
}

void GgufMetadataWriter::add_string(const std::string& k, const std::string& value) {
  key(k, 8);
  str(value);
}

void GgufMetadataWriter::add_u32(const std::string& k, uint32_t value) {
  key(k, 4);
  raw(&value, 4);
}

void GgufMetadataWriter::add_i64(const std::string& k, int64_t value) {
  key(k, 11);
  raw(&value, 8);
}

void GgufMetadataWriter::add_bool(const std::string& k, bool value) {
  key(k, 7);
  uint8_t b = value ? 1 : 0;
  raw(&b, 1);
}

void GgufMetadataWriter::add_strings(const std::string& k, const std::vector<std::string>& values) {
  key(k, 9);
  uint32_t et = 8;
  uint64_t n = values.size();
  raw(&et, 4);
  raw(&n, 8);
  for (const auto& v : values) str(v);
}

void GgufMetadataWriter::add_f32s(const std::string& k, const std::vector<float>& values) {
  key(k, 9);
  uint32_t et = 6;
  uint64_t n = values.size();
  raw(&et, 4);
  raw(&n, 8);
  raw(values.data(), values.size() * 4);
}

void GgufMetadataWriter::add_i32s(const std::string& k, const std::vector<int32_t>& values) {
  key(k, 9);
  uint32_t et = 5;
  uint64_t n = values.size();
  raw(&et, 4);
  raw(&n, 8);
  raw(values.data(), values.size() * 4);
}

void GgufMetadataWriter::write(const std::string& path) const {
  std::string out = "GGUF";
  uint32_t version = 3;
  uint64_t tensors = 0;
  out.append(reinterpret_cast<const char*>(&version), 4);
  out.append(reinterpret_cast<const char*>(&tensors), 8);
  out.append(reinterpret_cast<const char*>(&count_), 8);
  out += body_;
  while (out.size() % 32) out.push_back('\0');  // data section alignment
  write_binary(path, out);
}

std::string write_llama2_gguf(const std::string& dir) {
  const std::string data = read_binary(shared_dir() + "/tokenizers/llama2/tokenizer.bin");
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  size_t pos = 4;
  for (int i = 0; i < 32000; ++i) {
    float score;
    int32_t len;
    std::memcpy(&score, data.data() + pos, 4);
    std::memcpy(&len, data.data() + pos + 4, 4);
    std::string piece = data.substr(pos + 8, static_cast<size_t>(len));
    pos += 8 + static_cast<size_t>(len);
    int32_t type = 1;
    if (i == 0) {
      type = 2;
    } else if (i == 1 || i == 2) {
      piece = i == 1 ? "<s>" : "</s>";  // tokenizer.py wrote "\n<s>\n" / "\n</s>\n"
      type = 3;
    } else if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0) {
      type = 6;
    } else {
      std::string escaped;
      for (char c : piece) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      piece = escaped;
    }
    tokens.push_back(piece);
    scores.push_back(score);
    types.push_back(type);
  }
  GgufMetadataWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);
  std::string path = dir + "/llama2-vocab.gguf";
  w.write(path);
  return path;
}

}  // namespace kvscope::test
