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
// with S_lht = sum_{i<=t} beta_i^(t-i), the expected cache size of head (l, h).
// Only the gate parameters train (the model's weights have requires_grad =
// false); one window of seq_len tokens per step; AdamW with linear warmup
// and cosine decay. Deterministic for a seed (and thread count); resumable
// from <output>.ckpt; progress to stderr and <output>.log, the loss curve to
// <output>.csv, the gate file to <output> with <output minus .safetensors>.json
// beside it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "capture/gates/gate_set.h"
#include "capture/gates/kvpop_training.h"
#include "capture/gates/train_data.h"
#include "capture/generate/engine.h"

namespace kvscope::gates {

struct TrainOptions {
  GateKind kind = GateKind::WriteGate;
  nlohmann::json hyper_given = nlohmann::json::object();  // --gate key=value
  generate::ModelOptions model;
  DataOptions data;
  int64_t seq_len = 256;
  int64_t steps = 100;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double warmup = 0.1;  // share of the steps
  uint64_t seed = 0;
  // objectives (see the file comment)
  double lambda = 0.04;
  double alpha = 5.0, beta = 0.4;
  double budget = 0;  // M, tokens per head (0: seq_len / 4)
  double cap_weight = 1.0, ce_weight = 1.0;
  KvpopLossOptions kvpop;  // kvpop-*: target and boundary-loss options
  int64_t kl_topk = 256;   // kvpop-*: the KL over the teacher's top logits (seed 003 App. F)
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
};

// Throws InputError for bad options, data or a checkpoint that belongs to
// another run.
TrainResult train_gates(const TrainOptions& options);

// Paths written beside the gate file.
std::string sidecar_path(const std::string& output, const std::string& ext);

}  // namespace kvscope::gates
