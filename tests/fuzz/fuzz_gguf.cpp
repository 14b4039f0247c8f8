// libFuzzer target: GGUF (capture/formats/gguf.h): header, metadata, tensor
// directory; then what `kvscope` derives from a GGUF without running it: the
// embedded tokenizer (capture/tokenizer/load_gguf.cpp, with encode/decode of
// short texts) and the model config (capture/model/gguf_loader.h
// gguf_model_config). Small tensors are dequantised; every tensor accepted
// must lie inside the file.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "capture/formats/gguf.h"
#include "capture/model/gguf_loader.h"
#include "capture/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_tokenizer_text.h"

namespace {

void check_tensors(const kvscope::formats::GgufFile& g, size_t size) {
  for (const kvscope::formats::GgufTensor& t : g.tensors()) {
    if (t.offset > size || t.nbytes > size - t.offset) {
      std::fprintf(stderr, "tensor %s [%llu, +%llu) outside the %zu-byte file\n", t.name.c_str(),
                   (unsigned long long)t.offset, (unsigned long long)t.nbytes, size);
      std::abort();
    }
    if (kvscope::formats::ggml_type_supported(t.type) && t.elements() <= (1 << 16)) {
      std::vector<float> out(size_t(t.elements()));
      g.dequantize(t, out.data());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvscope::fuzz::MemFile file("model.gguf");
  const std::string& path = file.write(data, size);
  std::unique_ptr<kvscope::formats::GgufFile> g;
  if (!kvscope::fuzz::accepts([&] { g = std::make_unique<kvscope::formats::GgufFile>(path); }))
    return 0;
  check_tensors(*g, size);
  kvscope::fuzz::accepts([&] {
    auto tok = kvscope::tokenizer::Tokenizer::from_gguf(*g);
    kvscope::fuzz::exercise_tokenizer(*tok);
  });
  kvscope::fuzz::accepts([&] { kvscope::model::gguf_model_config(*g).describe(); });
  return 0;
}
