// A minimal GGUF v3 writer for tests: metadata of a few types and tensors
// given as raw block bytes, laid out as ggml's writer does (aligned offsets,
// zero padding). Lets a test build exactly the valid or broken file it needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::test {

class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, uint32_t value);
  void add_u64(const std::string& key, uint64_t value);
  void add_f32(const std::string& key, float value);
  void add_strings(const std::string& key, const std::vector<std::string>& values);
  // ne: ggml order (fastest first); bytes: the tensor data as stored.
  void add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  std::vector<uint8_t> bytes);
  // The whole file; offset_bias shifts every tensor offset (to break files).
  std::vector<uint8_t> bytes(uint64_t offset_bias = 0) const;
  void write(const std::string& path, uint64_t offset_bias = 0) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// f32 -> IEEE half (round to nearest even), for building F16/Q8_0 blocks.
uint16_t fp32_to_fp16(float f);

}  // namespace kvscope::test
