// `kvscope train`: learns one kind of gate for a frozen model with LibTorch
// autograd, each with its paper's objective (docs/training.md):
//   wgkv              L2 distillation of the final hidden states + lambda *
//                     mean(g + g(1 - g))                      (seed 000 §3.3)
//   attention-gate    KL(frozen || gated) of the next-token distributions +
//                     alpha * |mean(flags) - beta|            (seed 001 §3.5)
//   retention         KL + ce_weight * next-token CE + cap_weight *
//                     mean_{l,h,t} max(0, S_lht - M) / M      (TrimKV, seed 002 §2.2)
//   retention-global  as retention with one global budget:
//                     mean_t max(0, sum_{l,h} S_lht - L*K*M) / (L*K*M)   (seed 002 §4.1)
//   kvpop-mlp/-mlstm  the boundary-aware loss at the eviction boundary against
//                     the future-attention target (seed 003 eq. 7, 23, 24;
//                     kvpop_training.h); KL(teacher || sparse student) on
//                     the teacher's top-256 logits is reported (the scorer
//                     cannot move it: the top-k mask is hard)
//   dms               KL(student || teacher) of the next-token distributions +
//                     max(0, 1 - 1/cr(step) - mean(decisions)), Gumbel-sigmoid
//                     decisions with a straight-through share, cr ramped
//                     linearly (DMS; NVIDIA's adapter recipe, docs/policies/dms_learned.md)
//   restorekv         KL(teacher || student) of the continuation's next-token
//                     distributions, the student reading KVzip's kept entries and the
//                     restore tokens' (restorekv_training.cpp)
//   sfc-gru           from full-cache traces, not text: the asymmetric focal
//                     BCE on both outputs + the promotion-latency term
//                     (seed 004; train_sfc, sfc_trainer.cpp)
// with S_lht = sum_{i<=t} beta_i^(t-i), the expected cache size of head (l, h).
// Only the gate parameters train (the model's weights have requires_grad =
// false), except in KVpop's two fine-tuning settings (seed 003 §4, App. F;
// TrainOptions::base), where a copy of the base trains against the original,
// frozen model as the teacher and is written as a model file. One window of
// seq_len tokens per step; AdamW with linear warmup and cosine decay.
// Deterministic for a seed (and thread count); resumable from <output>.ckpt;
// progress to stderr and <output>.log, the loss curve to <output>.csv, the
// gate file to <output> with <output minus .safetensors>.json beside it.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/generate/engine.h"
#include "capture/train/kvpop_training.h"
#include "capture/train/train_data.h"

namespace kvscope::gates {

// The Latent Salience Forecaster (sfc-gru) trains from full-cache traces
// instead of text (sfc_trainer.cpp, docs/policies/sfc.md "Training").
struct SfcTrainOptions {
  std::vector<std::string> traces;   // --traces: captured with --policy full --capture received
  std::vector<std::string> holdout;  // --holdout: evaluated, never trained on
  int64_t tokens = 128;              // tokens sampled per trace and step
  int64_t groups = 0;                // (layer, kv head) groups sampled per step; 0: all
  int64_t bptt = 0;                  // truncated backprop every N steps; 0: whole trace
  int64_t eval_cells = int64_t(1) << 20;  // (group, step, token) entries per evaluation chunk
};

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
  // objectives (see the file comment)
  double lambda = 0.04;
  double alpha = 5.0, beta = 0.4;
  double budget = 0;  // M, tokens per head (0: seq_len / 4)
  double cap_weight = 1.0, ce_weight = 1.0;
  SfcTrainOptions sfc;     // sfc-gru: the traces and the batch shape (batch = traces per step)
  KvpopLossOptions kvpop;  // kvpop-*: target and boundary-loss options
  int64_t kl_topk = 256;   // kvpop-*: the KL over the teacher's top logits (seed 003 App. F)
  // The base model's weights (kvpop-* only besides Frozen):
  //   Frozen         scorer-only: the gates alone train
  //   Retrofit       the full retrofit (Algorithm 1): base and scorers train together on
  //                  KL(teacher || sparse student) over the teacher's top-kl_topk logits +
  //                  L_score; the scorers see detached K, V (§3.3), so L_score moves only
  //                  them and the KL (through the hard top-k mask) only the base
  //   StreamingPlus  StreamingLLM+ (§4): the base alone, KL only, under the fixed
  //                  sinks + window pattern of the same budget (s sinks, window w + k, no
  //                  scorer): what `streaming_llm:sinks=s,window=w+k` attends at decode
  // The teacher is the original model, a separate frozen copy; the student's
  // weights are cloned (the loaders' tensors view read-only memory maps).
  enum class Base { Frozen, Retrofit, StreamingPlus };
  Base base = Base::Frozen;
  double base_lr = 8e-5;      // constant learning rate of the base weights (Table 3)
  double lr_min = 0;          // floor of the gates' cosine (Table 3, new params: 8e-5)
  int64_t warmup_steps = -1;  // >= 0: warmup steps, instead of the share `warmup`
  double beta2 = 0.999;       // AdamW's second beta (Table 3: 0.95)
  double grad_clip = 0;       // clip the global gradient norm to this (0: no clipping)
  // The fine-tuned model (llama2.c .bin or HF directory, as the source):
  // Retrofit: "" = <output minus .safetensors>.bin (or that directory);
  // StreamingPlus writes it to `output` itself (no gate file).
  std::string model_out;
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
};

struct TrainResult {
  nlohmann::json summary;  // what went into the metadata's "training"
  double wall_seconds = 0;
  std::string model_file;  // the fine-tuned model written (Retrofit, StreamingPlus)
};

// Table 3's optimiser settings for a run that fine-tunes the base (Retrofit,
// StreamingPlus), for each of "--lr" (1e-3), "--lr-min" (8e-5),
// "--warmup-steps" (100), "--weight-decay" (1e-4), "--beta2" (0.95) and
// "--grad-clip" (1.0) not in `given` (the options the user set); the base's
// constant 8e-5 is base_lr's default. No change for a frozen base.
void apply_table3_defaults(TrainOptions& o, const std::set<std::string>& given);

// The gates' learning rate at `step` of o.steps, shared by every trainer with
// this schedule: linear warm-up over o.warmup_steps (or, when negative, the
// share o.warmup of the steps), then cosine down to o.lr_min.
double warmup_cosine_lr(const TrainOptions& o, int64_t step);

// Throws InputError for bad options, data or a checkpoint that belongs to
// another run.
TrainResult train_gates(const TrainOptions& options);

// sfc-gru: train_gates hands the options to this (sfc_trainer.cpp).
TrainResult train_sfc(const TrainOptions& options);
// qfilter and query-stats: calibration from the model's queries on the text
// (--data, --steps windows of --seq-len tokens; query_calibration.cpp).
TrainResult calibrate_queries(const TrainOptions& options);
// kvzap: KVzip+ scores of the text read back after a repeat prompt, and the
// per-layer ridge regression from hidden states to their logs
// (kvzap_calibration.cpp).
TrainResult calibrate_kvzap(const TrainOptions& options);
// fastkvzip: KVzip scores of the text read back after a repeat prompt, and
// the Fast KVzip gates trained on them by BCE (fastkvzip_training.cpp).
TrainResult train_fastkvzip(const TrainOptions& options);
// restorekv: restore tokens and LoRA adapters by self-distillation from the
// full-cache model under KVzip's eviction (restorekv_training.cpp).
TrainResult train_restorekv(const TrainOptions& options);

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
