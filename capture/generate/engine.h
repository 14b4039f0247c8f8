// Opening a model for inference the way every command does it: device and
// dtype checked against what this LibTorch build supports, thread count
// applied (LibTorch and OpenBLAS), weights loaded in any supported format and
// the tokenizer found (--tokenizer, tokenizer.json beside an HF model, the
// vocabulary inside a GGUF, tokenizer.bin beside a llama2.c checkpoint).
// `kvscope generate` and `kvscope capture` share it.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "capture/model/model_loader.h"
#include "capture/model/transformer.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::generate {

struct ModelOptions {
  std::string model;      // HF directory, .gguf or llama2.c .bin
  std::string tokenizer;  // optional override
  std::string device = "cpu";
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  std::string kv_dtype;        // the KV cache's rows: fp32 | bf16 | fp16; empty: dtype's
  int threads = 0;             // 0: leave LibTorch's default
};

struct Engine {
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null when none was found
  model::ModelFormat format = model::ModelFormat::HfDirectory;
  std::string tokenizer_source;  // where the tokenizer came from, or why there is none
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
  torch::ScalarType kv_dtype = torch::kFloat32;  // how the KV cache stores rows
  double load_seconds = 0;
};

// Throws InputError (naming --device/--dtype/--threads/--model/--tokenizer).
torch::Device parse_device(const std::string& device);
torch::ScalarType parse_dtype(const std::string& dtype, torch::Device device);
// --kv-dtype; empty: the weights' dtype (a bf16 model's keys are bf16 already,
// so its bf16 cache holds them exactly). The kernels accumulate in float32
// whatever the rows' width, on every device.
torch::ScalarType parse_kv_dtype(const std::string& kv_dtype, torch::ScalarType weights);
void set_threads(int threads);  // LibTorch, OpenBLAS and kernel threads (0: default_thread_count)
const char* dtype_name(torch::ScalarType t);

// Loads the tokenizer for a model (see the file comment); null plus a reason
// in *source when there is none and none was requested.
std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const std::string& model_path,
                                                     model::ModelFormat format,
                                                     const std::string& explicit_path,
                                                     int64_t vocab_size, std::string* source);

Engine open_engine(const ModelOptions& options);

}  // namespace kvscope::generate
