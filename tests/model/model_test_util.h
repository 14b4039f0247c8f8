// Helpers shared by the model tests: fixture paths, reading the expected
// logits files the fixture script writes, and max-abs comparisons.
#pragma once

#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would shadow Catch's: drop it before
// Catch defines its own.
#undef CHECK
#include <catch2/catch.hpp>

#include <string>

#include "capture/formats/safetensors.h"

namespace kvscope::test {

// tests/fixtures/model/<name>
std::string model_fixture(const std::string& name);

// A tensor of an expected-values safetensors file, copied out (F32 or I64).
torch::Tensor read_tensor(const formats::SafetensorsFile& file, const std::string& name);

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace kvscope::test
