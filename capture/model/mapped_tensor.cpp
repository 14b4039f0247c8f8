#include "capture/model/mapped_tensor.h"

#include <torch/torch.h>

#include <cstring>

namespace kvscope::model {

torch::Tensor mapped_tensor(std::shared_ptr<const void> owner, const uint8_t* data,
                            std::vector<int64_t> shape, torch::ScalarType dtype) {
  const auto options = torch::TensorOptions().dtype(dtype);
  const size_t element = torch::elementSize(dtype);
  if (reinterpret_cast<uintptr_t>(data) % element == 0) {
    // The deleter holds the owner (the mapping) until the tensor is freed.
    return torch::from_blob(
        const_cast<uint8_t*>(data), shape, [owner](void*) {}, options);
  }
  torch::Tensor t = torch::empty(shape, options);
  std::memcpy(t.data_ptr(), data, static_cast<size_t>(t.numel()) * element);
  return t;
}

}  // namespace kvscope::model
