// libFuzzer target: the safetensors header (capture/formats/safetensors.h):
// JSON header, dtypes, shapes, offsets, coverage of the data buffer. Every
// tensor it accepts must lie inside the file.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "capture/formats/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("model.safetensors");
  const std::string& path = file.write(data, size);
  kvscope::fuzz::accepts([&] {
    kvscope::formats::SafetensorsFile f(path);
    for (const auto& [name, t] : f.tensors()) {
      if (t.offset > size || t.nbytes > size - t.offset) {
        std::fprintf(stderr, "tensor %s [%llu, +%llu) outside the %zu-byte file\n", name.c_str(),
                     (unsigned long long)t.offset, (unsigned long long)t.nbytes, size);
        std::abort();
      }
      const int64_t bytes = int64_t(kvscope::formats::st_dtype_size(t.dtype));
      if (bytes > 0 && uint64_t(t.elements() * bytes) != t.nbytes) std::abort();
      if (t.nbytes > 0) {
        volatile uint8_t first = f.data(t)[0], last = f.data(t)[t.nbytes - 1];
        (void)first;
        (void)last;
      }
    }
  });
  return 0;
}
