// The gated-attention trainer: learns a gate set for a frozen model by
// autograd through the gated attention (gated_attention.h), one window of
// seq_len tokens per step, AdamW with linear warmup and cosine decay. It runs
// seven methods, each with its paper's objective (gated_methods.cpp registers
// them; docs/training.md):
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
// with S_lht = sum_{i<=t} beta_i^(t-i), the expected cache size of head (l, h).
// Only the gate parameters train (the model's weights have requires_grad =
// false), except in KVpop's two fine-tuning settings (seed 003 §4, App. F;
// GatedSettings::base), where a copy of the base trains against the
// original, frozen model as the teacher and is written as a model file.
// Deterministic for a seed (and thread count); resumable from <output>.ckpt;
// progress to stderr and <output>.log, the loss curve to <output>.csv, the
// gate file to <output> with <output minus .safetensors>.json beside it.
#pragma once

#include <string>

#include "capture/train/kvpop_training.h"
#include "capture/train/train_options.h"

namespace kvscope::gates {

// The methods' own settings (their descriptors fill them from the command line).
struct GatedSettings {
  double lambda = 0.04;                      // wgkv
  double alpha = 5.0, beta = 0.4;            // attention-gate
  double budget = 0;                         // retention*: M, tokens per head (0: seq_len / 4)
  double cap_weight = 1.0, ce_weight = 1.0;  // retention*
  KvpopLossOptions kvpop;                    // kvpop-*: target and boundary-loss options
  int64_t kl_topk = 256;  // kvpop-*: the KL over the teacher's top logits (App. F)
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
  double base_lr = 8e-5;  // constant learning rate of the base weights (Table 3)
  // The fine-tuned model (llama2.c .bin or HF directory, as the source):
  // Retrofit: "" = <output minus .safetensors>.bin (or that directory);
  // StreamingPlus writes it to `output` itself (no gate file).
  std::string model_out;
};

// Trains (or, with o.evaluate, evaluates) gates of o.kind. Throws InputError
// for bad options, data or a checkpoint that belongs to another run.
TrainResult train_gated(const TrainOptions& o, const GatedSettings& s);

// Table 3's optimiser settings for a run that fine-tunes the base (Retrofit,
// StreamingPlus), for each of "--lr" (1e-3), "--lr-min" (8e-5),
// "--warmup-steps" (100), "--weight-decay" (1e-4), "--beta2" (0.95) and
// "--grad-clip" (1.0) not in o.given; the base's constant 8e-5 is base_lr's
// default. No change for a frozen base.
void apply_table3_defaults(TrainOptions& o, GatedSettings::Base base);

}  // namespace kvscope::gates
