// libFuzzer target: torch.save archives (capture/gates/torch_pickle.h: the
// zip container and the restricted unpickler) and the official gate
// checkpoints read from them (capture/gates/official_checkpoints.h), against
// stories260K's shape.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

#include "capture/gates/official_checkpoints.h"
#include "capture/gates/torch_pickle.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_model_shape.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("gates.pt");
  static const kvscope::gates::GateShape shape =
      kvscope::gates::GateShape::of(kvscope::fuzz::stories260k_config());
  const std::string& path = file.write(data, size);
  kvscope::gates::looks_like_torch_save(path);
  kvscope::fuzz::accepts([&] {
    for (auto& [name, t] : kvscope::gates::read_torch_save(path)) t.sum();
  });
  kvscope::fuzz::accepts([&] { kvscope::gates::load_official_checkpoint(path, shape); });
  return 0;
}
