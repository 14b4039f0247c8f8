// Writes a model's weights back as a file its loader reads to the same
// tensors (float32), so a fine-tuned model (`kvscope train --retrofit`, the
// StreamingLLM+ run) runs under `kvscope capture --model`:
//   llama2.c  run.c's legacy .bin: the 7-int header, the arrays in run.c's
//             order, q/k rows back in Meta/interleaved order, the RoPE tables
//             export.py writes; for llama-architecture models only (RMSNorm
//             eps 1e-5, RoPE base 10000, no biases: what run.c fixes)
//   HF        a directory: the source's config.json (torch_dtype float32),
//             model.safetensors with the HF names, q/k/v and gate/up unfused
//             (GPT-2: Conv1D [in, out]), and the source's tokenizer files
// The fused wqkv / w_up layout and the rotate-half q/k rows of
// model_weights.h are undone exactly (row permutations and slices), so
// load -> write -> load gives bit-identical tensors and logits (tested).
#pragma once

#include <string>

#include "capture/model/model_loader.h"
#include "capture/model/transformer.h"

namespace kvscope::model {

// Throws InputError naming `path` when the model has what run.c cannot hold.
void write_llama2c(const Transformer& m, const std::string& path);

// Writes `dir` (created if needed) from the model and the HF directory it was
// loaded from (config and tokenizer files copied).
void write_hf_directory(const Transformer& m, const std::string& source_dir,
                        const std::string& dir);

// Writes `out` in the format of `source` (the path the model was loaded
// from): a .bin for llama2.c, a directory for HF. Returns the weight file a
// policy identifies the model by (its SHA-256): the .bin, or
// <dir>/model.safetensors. GGUF sources are refused (InputError naming
// `option`): KVScope reads GGUF, it does not write it.
std::string write_model_like(const Transformer& m, const std::string& source,
                             const std::string& out, const std::string& option);

}  // namespace kvscope::model
