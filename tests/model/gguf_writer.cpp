#include "tests/model/gguf_writer.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace kvscope::test {

namespace {

template <typename T>
void put(std::vector<uint8_t>* out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>* out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

}  // namespace

void GgufWriter::add_string(const std::string& key, const std::string& value) {
  put_string(&kv_, key);
  put<uint32_t>(&kv_, 8);
  put_string(&kv_, value);
  ++n_kv_;
}

void GgufWriter::add_u32(const std::string& key, uint32_t value) {
  put_string(&kv_, key);
  put<uint32_t>(&kv_, 4);
  put<uint32_t>(&kv_, value);
  ++n_kv_;
}

void GgufWriter::add_u64(const std::string& key, uint64_t value) {
  put_string(&kv_, key);
  put<uint32_t>(&kv_, 10);
  put<uint64_t>(&kv_, value);
  ++n_kv_;
}

void GgufWriter::add_f32(const std::string& key, float value) {
  put_string(&kv_, key);
  put<uint32_t>(&kv_, 6);
  put<float>(&kv_, value);
  ++n_kv_;
}

void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& values) {
  put_string(&kv_, key);
  put<uint32_t>(&kv_, 9);
  put<uint32_t>(&kv_, 8);
  put<uint64_t>(&kv_, values.size());
  for (const std::string& v : values) put_string(&kv_, v);
  ++n_kv_;
}

void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                            std::vector<uint8_t> bytes) {
  tensors_.push_back({name, std::move(ne), type, std::move(bytes)});
}

std::vector<uint8_t> GgufWriter::bytes(uint64_t offset_bias) const {
  constexpr uint64_t kAlign = 32;
  auto pad = [](uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  std::vector<uint8_t> out;
  put<uint32_t>(&out, 0x46554747);
  put<uint32_t>(&out, 3);
  put<uint64_t>(&out, tensors_.size());
  put<uint64_t>(&out, n_kv_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(&out, t.name);
    put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put<uint64_t>(&out, d);
    put<uint32_t>(&out, t.type);
    put<uint64_t>(&out, offset + offset_bias);
    offset += pad(t.data.size());
  }
  out.resize(pad(out.size()), 0);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(pad(out.size()), 0);
  }
  return out;
}

void GgufWriter::write(const std::string& path, uint64_t offset_bias) const {
  std::vector<uint8_t> b = bytes(offset_bias);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFFu;
  if (((x >> 23) & 0xFF) == 0xFF)
    return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(half);
}

}  // namespace kvscope::test
