// The weight-file readers on their own: GGUF metadata, dequantisation of
// every supported block type against hand-computed values, safetensors
// validation, and a clean InputError (never a crash) for every truncation
// and corruption.
#include "tests/model/model_test_util.h"  // first: orders LibTorch and Catch

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

#include "capture/formats/gguf.h"
#include "capture/formats/safetensors.h"
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
