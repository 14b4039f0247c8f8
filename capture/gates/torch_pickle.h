// Reads the tensors of a `torch.save` archive (the zip format PyTorch has
// written since 1.6) without Python: the official WG-KV and TrimKV gate
// checkpoints are such archives, holding a dict of tensors.
//
// LibTorch 1.13's own torch::pickle_load cannot read them: it rejects
// torch._utils._rebuild_parameter (WG-KV saves nn.Parameter values) and
// turns a top-level collections.OrderedDict (every state_dict) into None. So
// the zip container is read with LibTorch's PyTorchStreamReader and data.pkl
// with a small, strict unpickler for exactly what torch.save writes for a
// dict of tensors (pickle protocol 2): dict/OrderedDict, str keys,
// _rebuild_tensor_v2, _rebuild_parameter, typed storages. Anything else is
// an InputError naming the file and the pickle construct.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kvscope::gates {

// (name, tensor) in the order the dict was written. Tensors are float32
// copies (bf16/fp16/fp64 storages are converted), contiguous, on the CPU.
std::vector<std::pair<std::string, torch::Tensor>> read_torch_save(const std::string& path);

// True when the file starts like a zip archive (torch.save's format).
bool looks_like_torch_save(const std::string& path);

}  // namespace kvscope::gates
