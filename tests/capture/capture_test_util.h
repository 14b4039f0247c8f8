// Helpers of the capture tests: a small synthetic model shape, scripted
// attention inputs, and the stories260K model.
#pragma once

#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would shadow Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/model/transformer.h"
#include "core/trace/types.h"

namespace kvscope::test {

// 2 layers, 4 query heads, 2 kv heads, head_dim 32 (INT4 groups fit).
model::ModelConfig small_config();
// Random inputs for one layer and step (seeded): n tokens at pos0.
model::AttentionInputs random_inputs(const model::ModelConfig& c, int64_t layer, int64_t pos0,
                                     int64_t n, uint64_t seed);
// The trace's model record of a config made here (named "small", llama, fp32, cpu).
trace::ModelInfo model_info(const model::ModelConfig& c);
std::string stories_dir();
std::unique_ptr<model::Transformer> load_stories();

}  // namespace kvscope::test
