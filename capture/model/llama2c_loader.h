// llama2.c checkpoints (formats.md §5.1): the legacy header of seven int32
// (run.c's format) and the v1 "ak42" float32 export. Both hold q/k rows in
// Meta/interleaved order; RMSNorm eps 1e-5 and RoPE base 10000 are fixed by
// run.c.
#pragma once

#include <memory>
#include <string>

#include <torch/types.h>

#include "capture/model/model_config.h"
#include "capture/model/transformer.h"

namespace kvscope::model {

// True when the file starts like a llama2.c checkpoint (a v1 magic or a
// plausible legacy header whose size matches the file).
bool looks_like_llama2c(const std::string& path);

ModelConfig llama2c_model_config(const std::string& path);

std::unique_ptr<Transformer> load_llama2c_model(const std::string& path,
                                                const torch::TensorOptions& target);

}  // namespace kvscope::model
