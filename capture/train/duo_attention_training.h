// `kvscope train --policy duo-attention`: DuoAttention's head pattern
// (Xiao et al., ICLR 2025, §3.2; docs/policies/duo_attention.md "Training").
// Every (layer, kv head) gets a gate alpha in [0, 1] that mixes its full
// attention with its streaming attention (sinks + recent window),
//   out = alpha * attn_full + (1 - alpha) * attn_streaming,
// trained with the model frozen on synthetic multi-passkey retrieval samples
// (passkeys hidden in --data text, then asked for), by
//   loss = mean over the answer tokens of mean_D (h_full - h_mixed)^2
//          + reg * mean |alpha|
// with h the final-norm hidden states of the frozen full-attention model and
// of the mixed one. AdamW (no weight decay), the official trapezoid schedule
// (20 % warm-up, 20 % cool-down, floor 0.1), alpha clamped to [0, 1] before
// every step. The output is the official pattern directory that
// `duo_attention:pattern=DIR` reads: full_attention_heads.tsv and
// config.json (sink_size, recent_size, the base model and the run).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "capture/tokenizer/tokenizer.h"
#include "capture/train/train_options.h"

namespace kvscope::gates {

// --gate keys of duo-attention with their defaults (the official training
// script's): sinks 128, recent 256, passkeys 10, words 32 (words per
// passkey), reg 0.05 (weight of the L1 term).
struct DuoTrainSettings {
  int64_t sinks = 128, recent = 256, passkeys = 10, words = 32;
  double reg = 0.05;
};
// Reads o.hyper_given; an unknown key or a value out of range is an
// InputError naming --gate, the key and its range.
DuoTrainSettings duo_train_settings(const TrainOptions& o);

// One synthetic sample: seq_len ids; the loss covers [answer_from, size).
struct DuoSample {
  std::vector<int32_t> ids;
  int64_t answer_from = 0;
};
// `passkeys` passkeys of `words` NATO-alphabet words (seeded by `seed`) put
// into text[start, ...) at sorted depths in [0.05, 0.95], then the questions
// and the answers; the text fills the sample to exactly seq_len tokens.
// InputError when seq_len leaves fewer than 16 tokens of text.
DuoSample duo_passkey_sample(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& text,
                             int64_t start, int64_t seq_len, int64_t passkeys, int64_t words,
                             uint64_t seed);

// Trains and writes the directory o.output; the summary holds the loss
// curve and the held-out distillation loss of the trained pattern at
// sparsity 0.5 against the same sparsity with the ranking reversed.
TrainResult train_duo_attention(const TrainOptions& o);

}  // namespace kvscope::gates
