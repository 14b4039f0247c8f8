// The released gate checkpoints of the papers' official code, read as they
// are published (no conversion step):
//   WG-KV (github.com/EMCLab-Sinica/WG-KV, scripts/train.py save_model):
//     torch.save({name: nn.Parameter}) of every g_predictors parameter,
//     model.layers.{l}.self_attn.g_predictors.{pre_key_norm,post_key_norm}.weight [hd],
//     ....conv1.{weight [K*4*hd, 2*hd, 1], bias}, ....conv2.{weight [K, 4*hd, 1], bias}.
//     Inference settings are not in the file: the official defaults apply
//     (local window 256, threshold 0.1, g clamped at 1e-3).
//   TrimKV (github.com/ngocbh/trimkv, from_pretrained): a directory with
//     trimkv_weights.pth (a state dict of model.layers.{l}.self_attn.
//     retention_gate.{linear1.weight, linear1.bias, linear2.weight, bias})
//     and config.json (retention_gate "rg", hidden_act, memory_size, ...),
//     or the .pth file alone.
#pragma once

#include <string>

#include "capture/gates/gate_set.h"

namespace kvscope::gates {

// Reads an official checkpoint (a torch.save file or a TrimKV directory)
// into a GateSet; which paper it belongs to is told by its tensor names.
// Shapes are not checked here (load_gates does, against the model).
GateSet load_official_checkpoint(const std::string& path, const GateShape& model_shape);

}  // namespace kvscope::gates
