// GGUF (v2, v3) reader: metadata, tensor directory and dequantisation of the
// tensor types KVScope loads (F32, F16, BF16, Q8_0, Q4_0, Q4_1). Format facts:
// ../shared/reference/formats.md §3. Every size and offset is checked against
// the file before it is used; errors name the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "capture/formats/mapped_file.h"

namespace kvscope::formats {

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Scalars keep both an integer and a float view; arrays
// of strings or numbers keep their elements (nested arrays are skipped).
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  GgufValueType elem_type = GgufValueType::U8;  // for arrays
  int64_t i = 0;
  bool u64_overflow = false;  // a U64 value above 2^63 - 1: i cannot hold it
  double f = 0;
  std::string s;
  std::vector<std::string> strings;  // array of strings
  std::vector<double> numbers;       // array of numbers or bools

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::F32 || type == GgufValueType::F64; }
};

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};
const char* ggml_type_name(uint32_t type);
bool ggml_type_supported(uint32_t type);  // types dequantize() handles

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // fastest-varying first (ggml order)
  uint32_t type = 0;
  uint64_t offset = 0;      // absolute file offset of the data
  uint64_t nbytes = 0;
  int64_t elements() const;
  // PyTorch-order shape: ne reversed.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws InputError

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters: throw InputError naming the key when absent or mistyped
  // (or, for get_int, beyond int64).
  int64_t get_int(const std::string& key) const;
  // get_int within [lo, hi]; the message names the key, the value and the range.
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi) const;
  double get_float(const std::string& key) const;  // accepts integers too
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::vector<double>& get_numbers(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
  double get_float_or(const std::string& key, double fallback) const;
  bool get_bool_or(const std::string& key, bool fallback) const;
  std::string get_string_or(const std::string& key, const std::string& fallback) const;

  const GgufTensor* find_tensor(const std::string& name) const;
  const uint8_t* data(const GgufTensor& t) const { return file_.data() + t.offset; }
  // Dequantises a tensor into out[elements()]; throws InputError for types
  // KVScope does not implement (naming the tensor and the type).
  void dequantize(const GgufTensor& t, float* out) const;

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Element conversions shared by the loaders (formats.md §1.7).
float fp16_to_fp32(uint16_t h);
float bf16_to_fp32(uint16_t b);

}  // namespace kvscope::formats
