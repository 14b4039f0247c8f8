// Next-token choice from logits: greedy (argmax, first maximum on ties, as
// llama2.c and transformers do) or sampling with temperature, top-k and top-p
// from a seeded generator. Same seed and logits, same tokens, on every
// platform: the generator is mt19937_64 and the uniform draw is built from
// its bits, not from a library distribution.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <vector>

namespace kvscope::generate {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // > 0 when sampling
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // throws InputError for bad values
  // logits: float32 [V] (any device); returns the chosen id.
  int32_t next(const torch::Tensor& logits);

 private:
  double uniform();  // [0, 1)
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace kvscope::generate
