// libFuzzer target: Hugging Face config.json (capture/model/hf_config.h),
// the config every HF model directory is loaded from.
#include <cstddef>
#include <cstdint>

#include "capture/model/hf_config.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("config.json");
  const std::string& path = file.write(data, size);
  kvscope::fuzz::accepts([&] {
    kvscope::model::ModelConfig c = kvscope::model::parse_hf_config(path);
    c.describe();
    for (int64_t l = 0; l < c.n_layers && l < 4; ++l) c.attention_scale(l);
  });
  return 0;
}
