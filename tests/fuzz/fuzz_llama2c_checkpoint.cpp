// libFuzzer target: llama2.c checkpoints (capture/model/llama2c_loader.h):
// the format sniff, the header and config, and the load itself, which checks
// the weight layout against the file size before it maps any tensor (inputs
// are small, so what passes the check is small too).
#include <torch/types.h>

#include <cstddef>
#include <cstdint>

#include "capture/model/llama2c_loader.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("model.bin");
  const std::string& path = file.write(data, size);
  kvscope::model::looks_like_llama2c(path);
  kvscope::fuzz::accepts([&] { kvscope::model::llama2c_model_config(path).describe(); });
  kvscope::fuzz::accepts([&] {
    kvscope::model::load_llama2c_model(path, torch::TensorOptions().dtype(torch::kFloat32));
  });
  return 0;
}
