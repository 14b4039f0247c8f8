// Helpers of the learned gates' tests, shared by gate_tests (tests/gates),
// policy_tests (tests/policies: the learned policies) and train_tests
// (tests/train: the trainers): model shapes, scripted attention inputs,
// random gate files, and the stories260K model.
#pragma once

#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would shadow Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/model/transformer.h"

namespace kvscope::test {

// A synthetic model shape (no weights): L layers, H query heads, K kv heads.
model::ModelConfig gate_config(int64_t L, int64_t H, int64_t K, int64_t hd, int64_t D,
                               const std::string& name = "synthetic");
// stories260K's shape: 5 layers, 8 heads, 4 kv heads, head_dim 8, hidden 64.
model::ModelConfig stories_shape();
// Random inputs for one layer and step (seeded), n tokens at pos0.
model::AttentionInputs gate_inputs(const model::ModelConfig& c, int64_t layer, int64_t pos0,
                                   int64_t n, uint64_t seed);
// Every parameter of `set` replaced by N(0, scale) noise (seeded), so tests do
// not depend on an initialisation that makes terms vanish.
void randomize(gates::GateSet& set, uint64_t seed, double scale = 0.5);
// Gates of `kind` for shape c, hyperparameters `given` resolved, every
// parameter randomized (seeded): KVpop's scorers and policy.
gates::GateSet kvpop_set(gates::GateKind kind, const model::ModelConfig& c, nlohmann::json given,
                         uint64_t seed);
// The hyperparameters of a small Fast KVzip gate: dim 4, 3 sink keys.
nlohmann::json small_gate();
// Saves `set` into a fresh temp file and returns its path.
std::string save_temp(const gates::GateSet& set, const std::string& name);
std::string stories_model_path();
std::string stories_tokenizer_path();
std::string gate_fixture(const std::string& name);  // tests/fixtures/gates/<name>
// Column `col` of the train rows of a `kvscope train` .csv.
std::vector<double> csv_column(const std::string& csv, const std::string& col);
// Mean of v[from, to).
double mean(const std::vector<double>& v, size_t from, size_t to);
// Writes `repeats` copies of a short children's story to temp_dir()/name and
// returns the path (training text for the calibrations).
std::string write_story_text(const std::string& name, int repeats);

// One prefill step of n tokens of gate_inputs (seeded) through the policy
// `spec` on shape c: each layer's hidden rows [n, D] and, per (layer, kv
// head), the positions the cache holds afterwards.
struct Prefilled {
  std::vector<torch::Tensor> hidden;
  std::vector<std::vector<std::vector<int32_t>>> held;
};
Prefilled prefill_policy(const model::ModelConfig& c, const std::string& spec, int64_t n,
                         uint64_t seed);

}  // namespace kvscope::test
