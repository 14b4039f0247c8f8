// The weight-file readers on their own: GGUF metadata, dequantisation of
// every supported block type against hand-computed values, safetensors
// validation, and a clean InputError (never a crash) for every truncation
// and corruption.
#include "tests/model/model_test_util.h"  // first: orders LibTorch and Catch

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "capture/formats/gguf.h"
#include "capture/formats/safetensors.h"
#include "capture/model/gguf_loader.h"
#include "capture/model/hf_config.h"
#include "capture/model/llama2c_loader.h"
#include "core/common/input_error.h"
#include "tests/model/gguf_writer.h"
#include "tests/support/paths.h"

using kvscope::InputError;
using kvscope::formats::GgufFile;
using kvscope::formats::SafetensorsFile;
using kvscope::test::GgufWriter;

namespace {

std::vector<uint8_t> f16_bytes(float v) {
  uint16_t h = kvscope::test::fp32_to_fp16(v);
  return {static_cast<uint8_t>(h & 0xFF), static_cast<uint8_t>(h >> 8)};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
}

std::vector<float> dequantize(const GgufFile& g, const std::string& name) {
  const auto* t = g.find_tensor(name);
  REQUIRE(t != nullptr);
  std::vector<float> out(static_cast<size_t>(t->elements()));
  g.dequantize(*t, out.data());
  return out;
}

// One tensor of each supported type with known contents.
GgufWriter typed_tensors() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("test.count", 7);
  w.add_f32("test.eps", 1e-5f);
  w.add_strings("test.tokens", {"a", "bc", ""});
  std::vector<uint8_t> f32(4 * 4);
  const float fv[4] = {1.5f, -2.25f, 0.0f, 1e-3f};
  std::memcpy(f32.data(), fv, sizeof fv);
  w.add_tensor("f32", {4}, 0, f32);
  std::vector<uint8_t> f16;
  for (float v : {1.0f, -0.5f, 65504.0f, 6.103515625e-05f}) {
    auto b = f16_bytes(v);
    f16.insert(f16.end(), b.begin(), b.end());
  }
  w.add_tensor("f16", {4}, 1, f16);
  w.add_tensor("bf16", {2}, 30, {0x80, 0x3F, 0x40, 0xC0});  // 1.0, -3.0
  // Q8_0: d = 0.25, q = j - 16.
  std::vector<uint8_t> q8 = f16_bytes(0.25f);
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  w.add_tensor("q8_0", {32}, 8, q8);
  // Q4_0: d = 2, low nibble j, high nibble 15 - j.
  std::vector<uint8_t> q4 = f16_bytes(2.0f);
  for (int j = 0; j < 16; ++j) q4.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  w.add_tensor("q4_0", {32}, 2, q4);
  // Q4_1: d = 0.5, m = -1, same nibbles.
  std::vector<uint8_t> q41 = f16_bytes(0.5f);
  auto m = f16_bytes(-1.0f);
  q41.insert(q41.end(), m.begin(), m.end());
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  w.add_tensor("q4_1", {32}, 3, q41);
  return w;
}

}  // namespace

TEST_CASE("fp16 decoding agrees with LibTorch on all 65536 values", "[formats]") {
  torch::Tensor bits = torch::arange(65536, torch::kInt32).to(torch::kInt16);
  torch::Tensor ref = bits.view(torch::kFloat16).to(torch::kFloat32);
  const float* r = ref.data_ptr<float>();
  for (uint32_t h = 0; h < 65536; ++h) {
    const float mine = kvscope::formats::fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(r[h])) {
      REQUIRE(std::isnan(mine));
    } else {
      INFO("half bits " << h);
      REQUIRE(std::memcmp(&mine, &r[h], 4) == 0);
    }
  }
  CHECK(kvscope::formats::bf16_to_fp32(0x3F80) == 1.0f);
}

TEST_CASE("GGUF metadata and every supported tensor type decode to the expected values",
          "[formats][gguf]") {
  const std::string path = kvscope::test::temp_dir() + "/typed.gguf";
  typed_tensors().write(path);
  GgufFile g(path);
  CHECK(g.version() == 3);
  CHECK(g.get_string("general.architecture") == "llama");
  CHECK(g.get_int("test.count") == 7);
  CHECK(g.get_float("test.eps") == Approx(1e-5));
  CHECK(g.get_strings("test.tokens") == std::vector<std::string>{"a", "bc", ""});
  CHECK_THROWS_AS(g.get_int("general.architecture"), InputError);
  CHECK_THROWS_WITH(g.get_string("missing.key"), Catch::Contains("missing.key"));

  CHECK(dequantize(g, "f32") == std::vector<float>{1.5f, -2.25f, 0.0f, 1e-3f});
  CHECK(dequantize(g, "f16") == std::vector<float>{1.0f, -0.5f, 65504.0f, 6.103515625e-05f});
  CHECK(dequantize(g, "bf16") == std::vector<float>{1.0f, -3.0f});
  std::vector<float> q8 = dequantize(g, "q8_0"), q4 = dequantize(g, "q4_0"),
                     q41 = dequantize(g, "q4_1");
  for (int j = 0; j < 32; ++j) CHECK(q8[j] == 0.25f * static_cast<float>(j - 16));
  for (int j = 0; j < 16; ++j) {
    CHECK(q4[j] == 2.0f * static_cast<float>(j - 8));  // low nibbles: first half
    CHECK(q4[j + 16] == 2.0f * static_cast<float>(15 - j - 8));
    CHECK(q41[j] == 0.5f * static_cast<float>(j) - 1.0f);
    CHECK(q41[j + 16] == 0.5f * static_cast<float>(15 - j) - 1.0f);
  }
  CHECK(g.find_tensor("q8_0")->shape() == std::vector<int64_t>{32});
}

TEST_CASE("GGUF: every truncation of a file is a clean InputError", "[formats][gguf]") {
  const std::vector<uint8_t> full = typed_tensors().bytes();
  const std::string path = kvscope::test::temp_dir() + "/cut.gguf";
  // The last tensor (q4_1, 20 bytes) is followed by 12 bytes of alignment
  // padding a reader does not need; every cut before that must fail.
  const size_t needed = full.size() - 12;
  for (size_t n = 0; n < needed; n += (n < 400 ? 1 : 7)) {
    write_bytes(path, full, n);
    INFO("truncated to " << n << " of " << full.size() << " bytes");
    CHECK_THROWS_AS(GgufFile(path), InputError);
  }
  write_bytes(path, full, needed - 1);
  CHECK_THROWS_AS(GgufFile(path), InputError);
  write_bytes(path, full, needed);
  CHECK_NOTHROW(GgufFile(path));
}

TEST_CASE("GGUF: bad magic, version, offsets and types are named", "[formats][gguf]") {
  const std::string dir = kvscope::test::temp_dir();
  std::vector<uint8_t> b = typed_tensors().bytes();
  b[0] = 'X';
  write_bytes(dir + "/magic.gguf", b, b.size());
  CHECK_THROWS_WITH(GgufFile(dir + "/magic.gguf"), Catch::Contains("magic"));

  b = typed_tensors().bytes();
  b[4] = 1;  // version 1
  write_bytes(dir + "/v1.gguf", b, b.size());
  CHECK_THROWS_WITH(GgufFile(dir + "/v1.gguf"), Catch::Contains("version"));
  b[4] = 0, b[7] = 3;  // byte-swapped 3
  write_bytes(dir + "/be.gguf", b, b.size());
  CHECK_THROWS_WITH(GgufFile(dir + "/be.gguf"), Catch::Contains("big-endian"));

  typed_tensors().write(dir + "/offset.gguf", /*offset_bias=*/4096);
  CHECK_THROWS_WITH(GgufFile(dir + "/offset.gguf"), Catch::Contains("past the end"));

  GgufWriter unknown;
  unknown.add_tensor("weird", {32}, 99, std::vector<uint8_t>(64));
  unknown.write(dir + "/unknown.gguf");
  CHECK_THROWS_WITH(GgufFile(dir + "/unknown.gguf"),
                    Catch::Contains("weird") && Catch::Contains("99"));

  // Known but unimplemented (Q4_K): the file parses, dequantising names it.
  GgufWriter k;
  k.add_tensor("blk.0.ffn_down.weight", {256}, 12, std::vector<uint8_t>(144));
  k.write(dir + "/q4k.gguf");
  GgufFile g(dir + "/q4k.gguf");
  std::vector<float> out(256);
  CHECK_THROWS_WITH(g.dequantize(g.tensors()[0], out.data()),
                    Catch::Contains("blk.0.ffn_down.weight") && Catch::Contains("Q4_K"));
}

namespace {

// A safetensors file from (name, dtype, shape, bytes) entries in order.
struct StEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

std::vector<uint8_t> safetensors_bytes(const std::vector<StEntry>& entries,
                                       nlohmann::json* header_out = nullptr) {
  nlohmann::json h;
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  std::vector<uint8_t> data;
  for (const StEntry& e : entries) {
    h[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
    data.insert(data.end(), e.data.begin(), e.data.end());
  }
  if (header_out) *header_out = h;
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  std::vector<uint8_t> out(8);
  uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> with_header(const nlohmann::json& h, const std::vector<uint8_t>& data) {
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  std::vector<uint8_t> out(8);
  uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

const std::vector<StEntry> kEntries = {
    {"a", "F32", {2, 2}, std::vector<uint8_t>(16, 1)},
    {"b", "BF16", {3}, std::vector<uint8_t>(6, 2)},
    {"c", "I64", {1}, std::vector<uint8_t>(8, 3)},
};

}  // namespace

TEST_CASE("safetensors: a valid file lists its tensors at the right offsets", "[formats]") {
  const std::string path = kvscope::test::temp_dir() + "/ok.safetensors";
  const auto b = safetensors_bytes(kEntries);
  write_bytes(path, b, b.size());
  SafetensorsFile f(path);
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.find("a")->shape == std::vector<int64_t>{2, 2});
  CHECK(f.find("b")->dtype == kvscope::formats::StDtype::BF16);
  CHECK(f.data(*f.find("c"))[0] == 3);
  CHECK(f.data(*f.find("b"))[5] == 2);
}

TEST_CASE("safetensors: truncation and corrupt headers are clean InputErrors", "[formats]") {
  const std::string dir = kvscope::test::temp_dir();
  nlohmann::json h;
  const auto full = safetensors_bytes(kEntries, &h);
  for (size_t n = 0; n < full.size(); ++n) {
    write_bytes(dir + "/cut.safetensors", full, n);
    INFO("truncated to " << n << " of " << full.size());
    CHECK_THROWS_AS(SafetensorsFile(dir + "/cut.safetensors"), InputError);
  }
  std::vector<uint8_t> data(full.end() - 30, full.end());
  auto expect_error = [&](nlohmann::json header, const std::string& fragment) {
    const auto b = with_header(header, data);
    write_bytes(dir + "/bad.safetensors", b, b.size());
    CHECK_THROWS_WITH(SafetensorsFile(dir + "/bad.safetensors"), Catch::Contains(fragment));
  };
  nlohmann::json past = h;
  past["c"]["data_offsets"] = {22, 4000};
  expect_error(past, "past the end");
  nlohmann::json hole = h;
  hole["b"]["data_offsets"] = {18, 24};
  hole["b"]["shape"] = {3};
  expect_error(hole, "hole");
  nlohmann::json size = h;
  size["a"]["shape"] = {2, 3};
  expect_error(size, "need 24 bytes");
  nlohmann::json dtype = h;
  dtype["a"]["dtype"] = "F33";
  expect_error(dtype, "unknown dtype");
  nlohmann::json negative = h;
  negative["a"]["shape"] = {-2, 2};
  expect_error(negative, "non-negative");
  std::vector<uint8_t> huge(16, 0);
  huge[5] = 1;  // header length 2^40
  write_bytes(dir + "/huge.safetensors", huge, huge.size());
  CHECK_THROWS_WITH(SafetensorsFile(dir + "/huge.safetensors"), Catch::Contains("header length"));
}

// ---- model configs: sizes and ids are checked before they size anything ----

namespace {

std::string write_config(const nlohmann::json& j) {
  static int n = 0;
  const std::string dir = kvscope::test::temp_dir() + "/config" + std::to_string(n++);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump();
  return dir + "/config.json";
}

nlohmann::json tiny_llama_config() {
  return {{"model_type", "llama"},    {"vocab_size", 512},
          {"hidden_size", 64},        {"intermediate_size", 172},
          {"num_hidden_layers", 5},   {"num_attention_heads", 8},
          {"num_key_value_heads", 4}, {"max_position_embeddings", 512}};
}

std::string config_error(const nlohmann::json& j) {
  const std::string path = write_config(j);
  try {
    kvscope::model::parse_hf_config(path);
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path));
    return e.what();
  }
  return "no InputError";
}

}  // namespace

TEST_CASE("config.json sizes beyond the limits are refused before anything is allocated",
          "[formats][config]") {
  // 10^9 layers used to grow one sliding-window entry per layer (7.8 GB)
  // before std::bad_alloc.
  nlohmann::json j = tiny_llama_config();
  j["num_hidden_layers"] = 1000000000;
  CHECK_THAT(config_error(j), Catch::Contains("num_hidden_layers") &&
                                  Catch::Contains("1000000000") && Catch::Contains("4096"));
  nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"n_layer", 2000000000}};
  CHECK_THAT(config_error(gpt2),
             Catch::Contains("num_hidden_layers") && Catch::Contains("2000000000"));
  j = tiny_llama_config();
  j["vocab_size"] = int64_t(1) << 40;
  CHECK_THAT(config_error(j), Catch::Contains("vocab_size") && Catch::Contains("16777216"));
  j = tiny_llama_config();
  j["hidden_size"] = uint64_t(1) << 63;  // beyond int64: refused, not wrapped negative
  CHECK_THAT(config_error(j), Catch::Contains("hidden_size") &&
                                  Catch::Contains("9223372036854775808") &&
                                  Catch::Contains("64-bit integer range"));
  // A negative max_window_layers once indexed before the per-layer windows:
  // it means every layer.
  j = tiny_llama_config();
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  j["max_window_layers"] = -3;
  const auto c = kvscope::model::parse_hf_config(write_config(j));
  CHECK(c.sliding_window == std::vector<int64_t>(5, 64));
}

TEST_CASE("token ids beyond 32 bits in config.json are refused, not truncated",
          "[formats][config]") {
  nlohmann::json j = tiny_llama_config();
  j["eos_token_id"] = (int64_t(1) << 32) + 248;  // used to become 248
  CHECK_THAT(config_error(j), Catch::Contains("eos_token_id") && Catch::Contains("4294967544") &&
                                  Catch::Contains("[0, 2147483647]"));
  j["eos_token_id"] = {2, (int64_t(1) << 32) + 248};
  CHECK_THAT(config_error(j), Catch::Contains("eos_token_id[1]"));
  j["eos_token_id"] = 2;
  j["bos_token_id"] = -1;
  CHECK_THAT(config_error(j), Catch::Contains("bos_token_id") && Catch::Contains("-1"));
  j["bos_token_id"] = 1;
  const auto c = kvscope::model::parse_hf_config(write_config(j));
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_ids == std::vector<int32_t>{2});
}

TEST_CASE("GGUF metadata: sizes beyond the limits and ids beyond 32 bits name the key",
          "[formats][gguf][config]") {
  // A small llama GGUF with `block_count` layers and whatever `add` adds.
  auto config_error = [](uint32_t block_count, const std::function<void(GgufWriter&)>& add) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.embedding_length", 64);
    w.add_u32("llama.block_count", block_count);
    w.add_u32("llama.feed_forward_length", 128);
    w.add_u32("llama.attention.head_count", 8);
    w.add_u32("llama.context_length", 256);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    add(w);
    w.add_tensor("token_embd.weight", {64, 4}, 0, std::vector<uint8_t>(64 * 4 * 4));
    static int n = 0;
    const std::string path = kvscope::test::temp_dir() + "/meta" + std::to_string(n++) + ".gguf";
    w.write(path);
    try {
      kvscope::model::gguf_model_config(GgufFile(path));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  CHECK(config_error(2, [](GgufWriter&) {}) == "no InputError");
  CHECK_THAT(config_error(1000000000, [](GgufWriter&) {}), Catch::Contains("llama.block_count") &&
                                                               Catch::Contains("1000000000") &&
                                                               Catch::Contains("4096"));
  CHECK_THAT(config_error(2,
                          [](GgufWriter& w) {
                            w.add_u64("tokenizer.ggml.eos_token_id", (uint64_t(1) << 32) + 248);
                          }),
             Catch::Contains("tokenizer.ggml.eos_token_id") && Catch::Contains("4294967544"));
  CHECK_THAT(
      config_error(
          2, [](GgufWriter& w) { w.add_u64("tokenizer.ggml.bos_token_id", uint64_t(1) << 63); }),
      Catch::Contains("tokenizer.ggml.bos_token_id") && Catch::Contains("out of range"));
}

TEST_CASE("llama2.c headers: sizes beyond the limits and vocab_size -2^31 are InputErrors",
          "[formats][llama2c]") {
  auto header_error = [](const std::vector<int32_t>& h) {
    static int n = 0;
    const std::string path = kvscope::test::temp_dir() + "/header" + std::to_string(n++) + ".bin";
    std::vector<uint8_t> bytes(h.size() * 4 + 64, 0);
    std::memcpy(bytes.data(), h.data(), h.size() * 4);
    write_bytes(path, bytes, bytes.size());
    CHECK_FALSE(kvscope::model::looks_like_llama2c(path));
    try {
      kvscope::model::llama2c_model_config(path);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no InputError");
  };
  // vocab_size -2^31 (an unshared classifier of 2^31 tokens) was negated in
  // int32: undefined behaviour.
  CHECK_THAT(header_error({64, 172, 5, 8, 4, INT32_MIN, 512}),
             Catch::Contains("vocab_size") && Catch::Contains("2147483648"));
  CHECK_THAT(header_error({64, 172, 1000000, 8, 4, 512, 512}),
             Catch::Contains("n_layers") && Catch::Contains("1000000") && Catch::Contains("4096"));
}

TEST_CASE("a model larger than this machine's memory is refused before its weights are built",
          "[formats][config]") {
  // Within every size limit, but 4096 layers of hidden size 2^20 are ~10^16
  // parameters: the loader must say so, not start allocating.
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.embedding_length", 1 << 20);
  w.add_u32("llama.block_count", 4096);
  w.add_u32("llama.feed_forward_length", 1 << 22);
  w.add_u32("llama.attention.head_count", 4096);
  w.add_u32("llama.context_length", 256);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_tensor("token_embd.weight", {64, 4}, 0, std::vector<uint8_t>(64 * 4 * 4));
  const std::string path = kvscope::test::temp_dir() + "/huge.gguf";
  w.write(path);
  try {
    kvscope::model::load_gguf_model(path, torch::TensorOptions().dtype(torch::kFloat32));
    FAIL("no InputError");
  } catch (const InputError& e) {
    CHECK(e.field() == "config");
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("GiB of weights") &&
                             Catch::Contains("GiB of memory"));
  }
}

// Fuzzing finding (tests/fuzz/regressions/gguf): the integer view of a float
// value beyond int64 (or NaN) was a static_cast, undefined behaviour.
TEST_CASE("GGUF: float metadata beyond int64 and NaN parse as floats", "[formats][gguf]") {
  GgufWriter w;
  w.add_f32("test.huge", 6.9e22f);
  w.add_f32("test.nan", std::nanf(""));
  const std::string path = kvscope::test::temp_dir() + "/floats.gguf";
  w.write(path);
  GgufFile g(path);
  CHECK(g.get_float("test.huge") == Approx(6.9e22));
  CHECK(std::isnan(g.get_float("test.nan")));
  CHECK_THROWS_WITH(g.get_int("test.huge"), Catch::Contains("test.huge"));
}
