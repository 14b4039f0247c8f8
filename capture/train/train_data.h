// Training text for the gate trainer, offline only: plain-text files (real
// English from Debian-packaged documentation; scripts/gates/make-corpus
// builds one) and text the frozen model generates itself. Tokenised once
// into one id stream; the last part is held out for validation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/generate/engine.h"

namespace kvscope::gates {

struct DataOptions {
  std::vector<std::string> paths;  // text files or directories of them (sorted, recursive)
  int64_t generate_tokens = 0;     // model-generated tokens to add
  std::string generated_cache;     // where generated text is kept (reused when present)
  double temperature = 1.0;        // sampling of the generated text
  uint64_t seed = 0;
  double holdout = 0.1;  // share of the stream held out (at least 4 windows)
  int64_t window = 256;  // the training sequence length
};

struct TokenData {
  std::vector<int32_t> ids;  // the whole stream
  int64_t train_end = 0;     // [0, train_end) for training, [train_end, size) held out
  nlohmann::json describe;   // sources, bytes, sha256, token counts (for the gate metadata)
};

// Throws InputError for a missing, empty or non-text file, or when the data
// cannot fill a training window and the held-out part.
TokenData load_training_data(generate::Engine& engine, const DataOptions& options);

}  // namespace kvscope::gates
