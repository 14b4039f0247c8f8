#include "capture/formats/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/common/input_error.h"

namespace kvscope::formats {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100000000;  // the reference reader's limit

StDtype parse_dtype(const std::string& s) {
  if (s == "F32") return StDtype::F32;
  if (s == "F16") return StDtype::F16;
  if (s == "BF16") return StDtype::BF16;
  if (s == "F64") return StDtype::F64;
  if (s == "I64") return StDtype::I64;
  if (s == "I32") return StDtype::I32;
  if (s == "I16") return StDtype::I16;
  if (s == "I8") return StDtype::I8;
  if (s == "U8") return StDtype::U8;
  if (s == "BOOL") return StDtype::Bool;
  return StDtype::Other;
}

// a * b, or false on overflow of u64.
bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

int64_t st_dtype_bits(const std::string& s) {
  static const std::map<std::string, int64_t> bits = {
      {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
      {"F4", 4},      {"I16", 16},        {"U16", 16},        {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32},        {"F32", 32},        {"C64", 64},    {"F64", 64},
      {"I64", 64},    {"U64", 64}};
  auto it = bits.find(s);
  return it == bits.end() ? 0 : it->second;
}

size_t st_dtype_size(StDtype d) {
  switch (d) {
    case StDtype::F64:
    case StDtype::I64:
      return 8;
    case StDtype::F32:
    case StDtype::I32:
      return 4;
    case StDtype::F16:
    case StDtype::BF16:
    case StDtype::I16:
      return 2;
    case StDtype::I8:
    case StDtype::U8:
    case StDtype::Bool:
      return 1;
    default:
      return 0;
  }
}

int64_t StTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)) {
  const uint64_t size = file_->size();
  auto fail = [&](const std::string& field, const std::string& what) {
    throw InputError(path, field, what);
  };
  if (size < 8)
    fail("header", "file has " + std::to_string(size) +
                       " bytes; a safetensors file starts with an 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, file_->data(), 8);
  if (n > kMaxHeaderBytes)
    fail("header", "header length " + std::to_string(n) + " exceeds the limit of 100000000 bytes");
  if (8 + n > size)
    fail("header", "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(size) + " bytes): truncated or not safetensors");
  const char* h = reinterpret_cast<const char*>(file_->data() + 8);
  if (n == 0 || h[0] != '{') fail("header", "the JSON header must start with '{'");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h, h + n);
  } catch (const nlohmann::json::exception& e) {
    fail("header", std::string("invalid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header", "the JSON header must be an object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) relative, for coverage
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(name, "must be an object of strings");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("__metadata__." + k, "must be a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(name, "tensor entry must be an object with dtype, shape and data_offsets");
    StTensor t;
    t.name = name;
    if (!entry["dtype"].is_string()) fail(name + ".dtype", "must be a string");
    t.dtype_name = entry["dtype"].get<std::string>();
    t.dtype = parse_dtype(t.dtype_name);
    const int64_t bits = st_dtype_bits(t.dtype_name);
    if (bits == 0) fail(name + ".dtype", "unknown dtype \"" + t.dtype_name + "\"");
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(name + ".shape", "must be an array of non-negative integers");
    uint64_t elements = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        fail(name + ".shape", "must be an array of non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t(1) << 48) || !mul_ok(elements, dim, &elements))
        fail(name + ".shape", "element count overflows");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      fail(name + ".data_offsets", "must be [BEGIN, END] with non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end < begin)
      fail(name + ".data_offsets",
           "END " + std::to_string(end) + " is before BEGIN " + std::to_string(begin));
    if (end > data_size)
      fail(name + ".data_offsets",
           "[" + std::to_string(begin) + ", " + std::to_string(end) +
               ") lies past the end of the data buffer (" + std::to_string(data_size) +
               " bytes after the header): truncated file or corrupt header");
    uint64_t total_bits = 0;
    if (!mul_ok(elements, static_cast<uint64_t>(bits), &total_bits) || total_bits % 8 != 0 ||
        total_bits / 8 != end - begin)
      fail(name, "shape and dtype " + t.dtype_name + " need " + std::to_string(total_bits / 8) +
                     " bytes but data_offsets span " + std::to_string(end - begin));
    t.offset = data_start + begin;
    t.nbytes = end - begin;
    ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }

  // No holes, no overlaps, buffer fully covered (the reference reader's rule).
  std::sort(ranges.begin(), ranges.end());
  uint64_t expected = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != expected)
      fail("data_offsets", begin > expected
                               ? "hole in the data buffer at byte " + std::to_string(expected)
                               : "tensors overlap at byte " + std::to_string(begin));
    expected = end;
  }
  if (expected != data_size)
    fail("data_offsets", "tensors cover " + std::to_string(expected) +
                             " bytes of data but the file holds " + std::to_string(data_size) +
                             " after the header");
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace kvscope::formats
