// The model the gate and policy targets build against: stories260K's shape
// (../shared/models/stories260K/README.md), written out so the targets read
// no model file.
#pragma once

#include "capture/model/model_config.h"

namespace kvscope::fuzz {

inline model::ModelConfig stories260k_config() {
  model::ModelConfig c;
  c.arch = model::Architecture::Llama;
  c.source_format = "llama2.c";
  c.name = "stories260K";
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 172;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.context_length = 512;
  c.norm_eps = 1e-5;
  c.tied_embeddings = true;
  c.rope.dim = 8;
  c.sliding_window.assign(5, 0);
  c.bos_token_id = 1;
  c.eos_token_ids = {1, 2};
  return c;
}

}  // namespace kvscope::fuzz
