// What every trainer of `kvscope train` shares: the options common to all
// (model, text, windows, optimiser, bookkeeping, output), the result, and
// the helpers that write a trainer's outputs. A method's own options are
// ParamSpecs of its TrainerDescriptor (registry.h); each trainer, its
// objective and its paper: docs/training.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/generate/engine.h"
#include "capture/train/train_data.h"

namespace kvscope::gates {

struct TrainOptions {
  GateKind kind = GateKind::WriteGate;
  nlohmann::json hyper_given = nlohmann::json::object();  // --gate key=value
  generate::ModelOptions model;
  DataOptions data;
  int64_t seq_len = 256;
  int64_t steps = 100;
  int64_t batch = 1;  // windows per optimiser step, gradients accumulated
  double lr = 1e-3;
  double weight_decay = 0.01;
  double warmup = 0.1;  // share of the steps
  uint64_t seed = 0;
  double lr_min = 0;          // floor of the cosine (KVpop's Table 3, new params: 8e-5)
  int64_t warmup_steps = -1;  // >= 0: warmup steps, instead of the share `warmup`
  double beta2 = 0.999;       // AdamW's second beta (Table 3: 0.95)
  double grad_clip = 0;       // clip the global gradient norm to this (0: no clipping)
  // bookkeeping
  int64_t eval_every = 0;  // also evaluate on held-out text every N steps (0: at the end only)
  int64_t eval_windows = 8;
  int64_t checkpoint_every = 25;
  bool resume = false;
  int64_t stop_after = 0;  // stop after this many steps as if interrupted (tests of --resume)
  bool quiet = false;
  std::string output;    // gates .safetensors
  std::string evaluate;  // evaluate this gate file on the held-out text instead of training
  std::string command_line;
  // The shared options (as "--lr") the user set; a method's defaults that
  // differ from the shared ones (KVpop's Table 3) apply to the others.
  std::set<std::string> given;
};

struct TrainResult {
  nlohmann::json summary;  // what went into the metadata's "training"
  double wall_seconds = 0;
  std::string model_file;  // the fine-tuned model written (Retrofit, StreamingPlus)
};

// The gates' learning rate at `step` of o.steps, shared by every trainer with
// this schedule: linear warm-up over o.warmup_steps (or, when negative, the
// share o.warmup of the steps), then cosine down to o.lr_min.
double warmup_cosine_lr(const TrainOptions& o, int64_t step);

// What a gate file says about a model: `name` as the loader names it, the
// file's name and the sha256 of `hashed_file` (what policies hash to find
// shipped gates), and the shape.
nlohmann::json model_json(const model::ModelConfig& c, const std::string& name,
                          const std::string& path, const std::string& hashed_file);

// Paths written beside the gate file (or, for StreamingPlus, the model):
// `output` minus .safetensors or .bin, plus `ext`.
std::string sidecar_path(const std::string& output, const std::string& ext);

// The end of a fit outside the trainer's loop (the calibrations, Fast KVzip):
// the set's metadata gains base_model and `training` (plus the seed, the
// command line and the wall seconds since t0); writes the gate file and its
// .json sidecar.
TrainResult save_fitted_gates(GateSet set, const model::ModelConfig& c, const TrainOptions& o,
                              nlohmann::json training, std::chrono::steady_clock::time_point t0);

}  // namespace kvscope::gates
