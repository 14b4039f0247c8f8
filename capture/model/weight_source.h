// Where the weight builder gets tensors from. Each file format maps the
// canonical (GGUF-style) names the builder asks for — token_embd,
// blk.N.attn_q, blk.N.ffn_down.bias, output, ... — to its own names and
// returns the tensor as stored (CPU, f32/f16/bf16, a view of the memory map
// when it can be). The builder checks shapes against the config and does the
// layout work (q/k row order, Conv1D transpose, fusing, dtype, device).
#pragma once

#include <torch/types.h>

#include <string>

namespace kvscope::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const std::string& file() const = 0;  // for error messages
  virtual bool has(const std::string& canonical) const = 0;
  // Throws InputError naming the native tensor when it is missing or unreadable.
  virtual torch::Tensor get(const std::string& canonical) = 0;
  // The name the tensor has in the file (for error messages).
  virtual std::string native_name(const std::string& canonical) const = 0;
  // q/k rows in Meta/interleaved order (GGUF llama, llama2.c): the builder
  // permutes them into rotate-half order.
  virtual bool interleaved_qk() const { return false; }
  // GPT-2 Conv1D weights stored as [in, out] (HF): the builder transposes.
  virtual bool conv1d_layout() const { return false; }
};

}  // namespace kvscope::model
