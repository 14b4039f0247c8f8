#include "capture/formats/gguf.h"

#include <cstring>

#include "core/common/input_error.h"

namespace kvscope::formats {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;
constexpr int kMaxArrayDepth = 4;

struct TypeInfo {
  const char* name;
  int64_t block;  // elements per block, 0: unknown/unsupported size
  int64_t bytes;  // bytes per block
};

TypeInfo type_info(uint32_t t) {
  switch (t) {
    case 0:
      return {"F32", 1, 4};
    case 1:
      return {"F16", 1, 2};
    case 2:
      return {"Q4_0", 32, 18};
    case 3:
      return {"Q4_1", 32, 20};
    case 6:
      return {"Q5_0", 32, 22};
    case 7:
      return {"Q5_1", 32, 24};
    case 8:
      return {"Q8_0", 32, 34};
    case 9:
      return {"Q8_1", 32, 36};
    case 10:
      return {"Q2_K", 256, 84};
    case 11:
      return {"Q3_K", 256, 110};
    case 12:
      return {"Q4_K", 256, 144};
    case 13:
      return {"Q5_K", 256, 176};
    case 14:
      return {"Q6_K", 256, 210};
    case 15:
      return {"Q8_K", 256, 292};
    case 24:
      return {"I8", 1, 1};
    case 25:
      return {"I16", 1, 2};
    case 26:
      return {"I32", 1, 4};
    case 27:
      return {"I64", 1, 8};
    case 28:
      return {"F64", 1, 8};
    case 30:
      return {"BF16", 1, 2};
    default:
      return {"unknown", 0, 0};
  }
}

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const MappedFile& f) : f_(f) {}
  uint64_t pos() const { return pos_; }
  void seek(uint64_t p) { pos_ = p; }

  template <typename T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, f_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& field) {
    uint64_t len = read<uint64_t>(field);
    if (len > kMaxStringBytes) fail(field, "string length " + std::to_string(len) + " is absurd");
    need(len, field);
    std::string s(reinterpret_cast<const char*>(f_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }
  void need(uint64_t n, const std::string& field) const {
    if (n > f_.size() || pos_ > f_.size() - n)
      fail(field, "file ends at byte " + std::to_string(f_.size()) + " but " + std::to_string(n) +
                      " more bytes are needed at offset " + std::to_string(pos_) +
                      " (truncated GGUF?)");
  }
  uint64_t remaining() const { return f_.size() - pos_; }
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InputError(f_.path(), field, what);
  }

 private:
  const MappedFile& f_;
  uint64_t pos_ = 0;
};

uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::Bool:
      return 1;
    case GgufValueType::U16:
    case GgufValueType::I16:
      return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32:
      return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64:
      return 8;
    default:
      return 0;
  }
}

// The integer view of a float value (never read as an integer: get_int
// wants an integer type), 0 when it has none: converting NaN or a value
// beyond int64 is undefined behaviour.
int64_t integer_view(double f) {
  return f > -9.2e18 && f < 9.2e18 ? static_cast<int64_t>(f) : 0;
}

// Reads one scalar into v (integer and float views).
void read_scalar(Cursor& c, GgufValueType t, const std::string& key, GgufValue* v) {
  switch (t) {
    case GgufValueType::U8:
      v->i = c.read<uint8_t>(key);
      break;
    case GgufValueType::I8:
      v->i = c.read<int8_t>(key);
      break;
    case GgufValueType::U16:
      v->i = c.read<uint16_t>(key);
      break;
    case GgufValueType::I16:
      v->i = c.read<int16_t>(key);
      break;
    case GgufValueType::U32:
      v->i = c.read<uint32_t>(key);
      break;
    case GgufValueType::I32:
      v->i = c.read<int32_t>(key);
      break;
    case GgufValueType::U64: {
      const uint64_t u = c.read<uint64_t>(key);
      v->u64_overflow = u > static_cast<uint64_t>(INT64_MAX);
      v->i = v->u64_overflow ? INT64_MAX : static_cast<int64_t>(u);
      break;
    }
    case GgufValueType::I64:
      v->i = c.read<int64_t>(key);
      break;
    case GgufValueType::F32:
      v->f = c.read<float>(key);
      v->i = integer_view(v->f);
      return;
    case GgufValueType::F64:
      v->f = c.read<double>(key);
      v->i = integer_view(v->f);
      return;
    case GgufValueType::Bool: {
      uint8_t b = c.read<uint8_t>(key);
      if (b > 1) c.fail(key, "boolean value " + std::to_string(b) + " (expected 0 or 1)");
      v->i = b;
      break;
    }
    default:
      c.fail(key, "not a scalar type");
  }
  v->f = static_cast<double>(v->i);
}

void read_value(Cursor& c, GgufValueType t, const std::string& key, GgufValue* v, int depth);

void read_array(Cursor& c, const std::string& key, GgufValue* v, int depth) {
  if (depth > kMaxArrayDepth)
    c.fail(key, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  uint32_t et = c.read<uint32_t>(key);
  if (et > 12) c.fail(key, "unknown array element type " + std::to_string(et));
  v->elem_type = static_cast<GgufValueType>(et);
  uint64_t count = c.read<uint64_t>(key);
  uint64_t min_size = v->elem_type == GgufValueType::String ? 8 : scalar_size(v->elem_type);
  if (min_size == 0) min_size = 12;  // nested array header
  if (count > c.remaining() / min_size)
    c.fail(key, "array of " + std::to_string(count) + " elements cannot fit in the file");
  if (v->elem_type == GgufValueType::String) {
    v->strings.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) v->strings.push_back(c.string(key));
  } else if (v->elem_type == GgufValueType::Array) {
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue nested;
      read_array(c, key, &nested, depth + 1);  // parsed for position, not kept
    }
  } else {
    v->numbers.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
      GgufValue e;
      read_scalar(c, v->elem_type, key, &e);
      v->numbers.push_back(e.type == GgufValueType::F32 || v->elem_type == GgufValueType::F32 ||
                                   v->elem_type == GgufValueType::F64
                               ? e.f
                               : static_cast<double>(e.i));
    }
  }
}

void read_value(Cursor& c, GgufValueType t, const std::string& key, GgufValue* v, int depth) {
  v->type = t;
  if (t == GgufValueType::String)
    v->s = c.string(key);
  else if (t == GgufValueType::Array)
    read_array(c, key, v, depth);
  else
    read_scalar(c, t, key, v);
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::U16:
    case GgufValueType::I16:
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::U64:
    case GgufValueType::I64:
      return true;
    default:
      return false;
  }
}

const char* ggml_type_name(uint32_t type) {
  return type_info(type).name;
}

bool ggml_type_supported(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
      return true;
    default:
      return false;
  }
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const {
  return std::vector<int64_t>(ne.rbegin(), ne.rend());
}

GgufFile::GgufFile(const std::string& path) : file_(path) {
  Cursor c(file_);
  uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) c.fail("magic", "not a GGUF file (expected the bytes 'GGUF')");
  version_ = c.read<uint32_t>("version");
  if (version_ != 0 && (version_ & 0xFFFFu) == 0)
    c.fail("version", "the file is big-endian (byte-swapped version " + std::to_string(version_) +
                          "); only little-endian GGUF is supported");
  if (version_ != 2 && version_ != 3)
    c.fail("version", "GGUF version " + std::to_string(version_) + " (expected 2 or 3)");
  uint64_t n_tensors = c.read<uint64_t>("tensor_count");
  uint64_t n_kv = c.read<uint64_t>("metadata_kv_count");
  if (n_kv > c.remaining() / 12)
    c.fail("metadata_kv_count", std::to_string(n_kv) + " is absurd for the file size");
  if (n_tensors > c.remaining() / 24)
    c.fail("tensor_count", std::to_string(n_tensors) + " is absurd for the file size");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("metadata key " + std::to_string(i));
    uint32_t t = c.read<uint32_t>(key);
    if (t > 12) c.fail(key, "unknown metadata value type " + std::to_string(t));
    GgufValue v;
    read_value(c, static_cast<GgufValueType>(t), key, &v, 0);
    if (!metadata_.emplace(key, std::move(v)).second) c.fail(key, "duplicate metadata key");
  }

  uint64_t alignment = 32;
  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || (a->i & (a->i - 1)) != 0)
      c.fail("general.alignment", "must be a positive power of two");
    alignment = static_cast<uint64_t>(a->i);
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor " + std::to_string(i) + " name");
    uint32_t n_dims = c.read<uint32_t>(t.name);
    if (n_dims == 0 || n_dims > 4)
      c.fail(t.name, "n_dims " + std::to_string(n_dims) + " (expected 1..4)");
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>(t.name);
      if (ne == 0 || ne > (uint64_t(1) << 40))
        c.fail(t.name, "dimension " + std::to_string(ne) + " is absurd");
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.type = c.read<uint32_t>(t.name);
    t.offset = c.read<uint64_t>(t.name);
    TypeInfo info = type_info(t.type);
    if (info.block == 0) c.fail(t.name, "unknown ggml type id " + std::to_string(t.type));
    if (t.ne[0] % info.block != 0)
      c.fail(t.name, "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                         info.name + " block size " + std::to_string(info.block));
    // Element counts are bounded so the byte size below cannot overflow.
    uint64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) {
      rows *= static_cast<uint64_t>(t.ne[d]);
      if (rows > (uint64_t(1) << 40)) c.fail(t.name, "element count is absurd");
    }
    if (rows * static_cast<uint64_t>(t.ne[0]) > (uint64_t(1) << 40))
      c.fail(t.name, "element count is absurd");
    t.nbytes =
        static_cast<uint64_t>(t.ne[0] / info.block) * static_cast<uint64_t>(info.bytes) * rows;
    if (t.offset % alignment != 0)
      c.fail(t.name, "data offset is not a multiple of the alignment " + std::to_string(alignment));
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      c.fail(t.name, "duplicate tensor name");
    tensors_.push_back(std::move(t));
  }
  uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (GgufTensor& t : tensors_) {
    if (t.offset > file_.size() || data_start > file_.size() - t.offset ||
        t.nbytes > file_.size() - data_start - t.offset)
      c.fail(t.name, "data [" + std::to_string(data_start + t.offset) + ", +" +
                         std::to_string(t.nbytes) + ") lies past the end of the file (" +
                         std::to_string(file_.size()) + " bytes)");
    t.offset += data_start;
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void missing(const std::string& path, const std::string& key, const char* expected) {
  throw InputError(path, key, std::string("missing or not ") + expected);
}
}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || !v->is_integer()) missing(path(), key, "an integer");
  if (v->u64_overflow) throw InputError(path(), key, "a U64 value above 2^63 - 1 (out of range)");
  return v->i;
}

int64_t GgufFile::get_int_in(const std::string& key, int64_t lo, int64_t hi) const {
  const int64_t x = get_int(key);
  if (x < lo || x > hi)
    throw InputError(
        path(), key,
        std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || !(v->is_float() || v->is_integer())) missing(path(), key, "a number");
  return v->f;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::Bool) missing(path(), key, "a boolean");
  return v->i != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::String) missing(path(), key, "a string");
  return v->s;
}

const std::vector<std::string>& GgufFile::get_strings(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::Array || v->elem_type != GgufValueType::String)
    missing(path(), key, "an array of strings");
  return v->strings;
}

const std::vector<double>& GgufFile::get_numbers(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v || v->type != GgufValueType::Array || v->elem_type == GgufValueType::String ||
      v->elem_type == GgufValueType::Array)
    missing(path(), key, "an array of numbers");
  return v->numbers;
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float_or(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool_or(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}
std::string GgufFile::get_string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

float fp16_to_fp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

float bf16_to_fp32(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

void GgufFile::dequantize(const GgufTensor& t, float* out) const {
  const uint8_t* p = data(t);
  const int64_t n = t.elements();
  auto f16 = [](const uint8_t* q) {
    uint16_t h;
    std::memcpy(&h, q, 2);
    return fp16_to_fp32(h);
  };
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::F32:
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        out[i] = bf16_to_fp32(b);
      }
      return;
    case GgmlType::Q8_0:  // d, qs[32]: y = d * q
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = p + b * 34;
        float d = f16(blk);
        for (int j = 0; j < 32; ++j)
          out[b * 32 + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      }
      return;
    case GgmlType::Q4_0:  // d, qs[16]: low nibbles first 16, high nibbles last 16, minus 8
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = p + b * 18;
        float d = f16(blk);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = d * static_cast<float>((blk[2 + j] & 0x0F) - 8);
          out[b * 32 + j + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::Q4_1:  // d, m, qs[16]: y = d * q + m
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = p + b * 20;
        float d = f16(blk), m = f16(blk + 2);
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = d * static_cast<float>(blk[4 + j] & 0x0F) + m;
          out[b * 32 + j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
        }
      }
      return;
    default:
      throw InputError(
          path(), t.name,
          std::string("tensor type ") + ggml_type_name(t.type) +
              " is not supported (KVScope dequantises F32, F16, BF16, Q8_0, Q4_0, Q4_1)");
  }
}

}  // namespace kvscope::formats
