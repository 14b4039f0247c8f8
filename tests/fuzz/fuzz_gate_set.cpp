// libFuzzer target: gate files (capture/gates/gate_set.h load_gates): a
// kvscope safetensors gate file with its JSON metadata, or an official
// checkpoint, checked against stories260K's shape.
#include <cstddef>
#include <cstdint>

#include "capture/gates/gate_set.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_model_shape.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("gates.safetensors");
  static const kvscope::model::ModelConfig model = kvscope::fuzz::stories260k_config();
  const std::string& path = file.write(data, size);
  kvscope::fuzz::accepts([&] {
    kvscope::gates::GateSet set = kvscope::gates::load_gates(path, model);
    for (const auto& [name, t] : set.params) t.sum();
  });
  return 0;
}
