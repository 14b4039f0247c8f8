// safetensors reader: the JSON header is parsed and validated the way the
// reference implementation does (formats.md §1.4: no holes, no overlaps, sizes
// equal shape x dtype, buffer fully covered); tensor bytes stay in the memory
// map. Errors name the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capture/formats/mapped_file.h"

namespace kvscope::formats {

enum class StDtype { F32, F16, BF16, F64, I64, I32, I16, I8, U8, Bool, Other };

struct StTensor {
  std::string name;
  std::string dtype_name;  // as written in the header, e.g. "BF16"
  StDtype dtype = StDtype::Other;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t nbytes = 0;
  int64_t elements() const;
};

int64_t st_dtype_bits(const std::string& dtype_name);  // 0 for unknown names
size_t st_dtype_size(StDtype dtype);                   // bytes per element (Other: 0)

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws InputError

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensor* find(const std::string& name) const;
  const uint8_t* data(const StTensor& t) const { return file_->data() + t.offset; }
  // The mapping, shared so tensors that view it in place can keep it alive.
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kvscope::formats
