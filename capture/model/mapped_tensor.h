// Tensors over memory-mapped file bytes. When the bytes are suitably aligned
// the tensor views the mapping in place (the mapping stays alive as long as
// the tensor does); otherwise the bytes are copied once into a new tensor.
// The mapping is read-only, so these tensors must never be written.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace kvscope::model {

torch::Tensor mapped_tensor(std::shared_ptr<const void> owner, const uint8_t* data,
                            std::vector<int64_t> shape, torch::ScalarType dtype);

}  // namespace kvscope::model
