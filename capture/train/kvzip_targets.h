// KVzip's scores as training targets (kvzap and fastkvzip calibrations): a
// window of text, a repeat prompt and the same window again go through the
// model in one forward pass with a dense cache; each entry of the first
// window gets the largest attention weight a query of the read-back puts on
// it, over the repeat's queries and the kv head's group of query heads:
//   KVzip   y(l, k, j) = max_{g, i} p_lgi(j)                        (in (0, 1])
//   KVzip+  y(l, k, j) = log max_g ||v_j W_O^g|| max_i p_lgi(j) / ||h_i||
// with p the causal softmax of query i over everything before it and h_i its
// normalised layer input. The inputs are the first window's normalised layer
// inputs h_j. docs/policies/kvzap.md, docs/policies/fastkvzip.md
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "capture/generate/dense_kv_cache.h"
#include "capture/generate/engine.h"
#include "capture/model/model_weights.h"
#include "capture/train/train_data.h"

namespace kvscope::gates {

// kvpress's first repeat prompt (kvzip_press.py) with its suffix for a model
// without a chat template.
constexpr const char* kKvzipRepeatPrompt = "\n\nRepeat the previous context exactly.\n";

class KvzipTargets : public model::AttentionBackend {
 public:
  // window: tokens T of each copy; repeat: tokens of the repeat prompt; plus:
  // KVzip+ (logs) or KVzip (probabilities).
  KvzipTargets(const model::ModelConfig& c, const model::ModelWeights& w, int64_t window,
               int64_t repeat, bool plus);
  void reset() { dense_.reset(); }
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& in) override;

  // Per layer, over every window fed: sums [h, 1]^T [h, 1] and [h, 1]^T y
  // (float64, [D+1, D+1] and [D+1, K]), for a linear fit.
  std::vector<torch::Tensor> xtx, xty;
  // When set, every (h, y) too: per window and layer in that order, [T, D]
  // and [T, K] float32.
  bool keep_samples = false;
  std::vector<torch::Tensor> xs, ys;

 private:
  torch::Tensor targets(const model::AttentionInputs& in) const;  // [T, K]

  generate::DenseKvCache dense_;
  std::vector<torch::Tensor> wo_;  // KVzip+: per layer [H, hd, D]
  int64_t T_, P_;
  bool plus_;
};

// Causal attention probabilities of the step's queries [q0, q0 + nq) over
// every key of the step (the step starts at position 0), within the model's
// sliding window: [H, nq, N] float32. Shared by the read-back targets and the
// LU-KV profile's future utility (lukv_profiling.cpp).
torch::Tensor step_probabilities(const model::AttentionInputs& in, int64_t q0, int64_t nq);

struct TrainOptions;

// What the read-back fits (kvzap, fastkvzip) start from: the model, the text
// (--data, windows of --seq-len) and the repeat prompt's tokens. Throws
// InputError when the model has no tokenizer (`policy` names the fit).
struct ReadBackSource {
  generate::Engine engine;
  TokenData data;
  std::vector<int32_t> repeat;
};
ReadBackSource open_read_back(const TrainOptions& o, const std::string& policy);
// Feeds `windows` read-backs of `window` tokens through `rec`: consecutive
// windows of the training part, or of the held-out tail.
void feed_read_backs(ReadBackSource& s, KvzipTargets& rec, int64_t window, int64_t windows,
                     bool held_out);
// rec's kept samples stacked per layer: [N, D] and [N, K] over its windows.
void stack_samples(const KvzipTargets& rec, int64_t layers, std::vector<torch::Tensor>* x,
                   std::vector<torch::Tensor>* y);

// Window w's start among [begin, end): consecutive windows, wrapping around.
int64_t kvzip_window_start(int64_t w, int64_t window, int64_t begin, int64_t end);
// ids[start, start + window) + repeat + ids[start, start + window).
torch::Tensor kvzip_read_back(const std::vector<int32_t>& ids, int64_t start, int64_t window,
                              const std::vector<int32_t>& repeat);

}  // namespace kvscope::gates
