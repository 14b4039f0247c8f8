// Learned KV-cache gates: the parameters of one of the three seed gate
// networks for every layer of one model, plus their metadata. One format on
// disk (docs/training.md, "Gate files"): a safetensors file whose tensors are
// the parameters (float32, names below) and whose __metadata__ holds one key,
// "kvscope.gates", a JSON document:
//   {"format": "kvscope-gates", "version": 1, "policy": KIND,
//    "hyperparameters": {...}, "base_model": {name, file, sha256, shape},
//    "training": {data, steps, seq_len, seed, command, wall_seconds, losses}}
//
// Tensor names (L layers, K kv heads, hd head dim, D hidden size):
//   wgkv (seed 000 §3.2), per layer l, the official WG-KV names minus "model.":
//     layers.{l}.self_attn.g_predictors.pre_key_norm.weight   [hd]
//     layers.{l}.self_attn.g_predictors.post_key_norm.weight  [hd]
//     layers.{l}.self_attn.g_predictors.conv1.weight   [K*E*hd, 2*hd, 1]  (E = expand, 4)
//     layers.{l}.self_attn.g_predictors.conv1.bias     [K*E*hd]
//     layers.{l}.self_attn.g_predictors.conv2.weight   [K, E*hd, 1]
//     layers.{l}.self_attn.g_predictors.conv2.bias     [K]
//   attention-gate (seed 001 §3.3), h' heads of width d':
//     layers.{l}.attention_gate.{q,k,v}_proj.weight    [h'*d', D]
//     layers.{l}.attention_gate.o_proj.weight          [K, h'*d']
//   retention (TrimKV), the official names minus "model.", I = hidden:
//     layers.{l}.self_attn.retention_gate.linear1.weight  [I, D]
//     layers.{l}.self_attn.retention_gate.linear1.bias    [I]
//     layers.{l}.self_attn.retention_gate.linear2.weight  [K, I]
//     layers.{l}.self_attn.retention_gate.bias            [K]
//   retention-global (DBTrimKV, seed 002 §4.1), I = hidden per head:
//     layers.{l}.self_attn.retention_gate.linear1.weight  [K*I, D]
//     layers.{l}.self_attn.retention_gate.linear1.bias    [K*I]
//     retention_gate_shared.linear2.weight                [1, I]   (tied across layers and heads)
//     retention_gate_shared.bias                          [1]
//   kvpop-mlp (seed 003 §3.3, E.2), I = hidden, per layer l:
//     layers.{l}.kvpop.decay_logit   [K]            (alpha_h of eq. 21)
//     layers.{l}.kvpop.mlp.w1        [K, 2*hd, I]   layers.{l}.kvpop.mlp.b1  [K, I]
//     layers.{l}.kvpop.mlp.w2        [K, I]         layers.{l}.kvpop.mlp.b2  [K]
//   kvpop-mlstm (seed 003 §3.3, E.3-E.5), P = proj (hd / 2), per layer l:
//     layers.{l}.kvpop.decay_logit   [K]
//     layers.{l}.kvpop.mlstm.{wq,wk,wv}  [K, 2*hd, P]
//     layers.{l}.kvpop.mlstm.{wi,wf}     [K, 2*hd]    .{bi,bf} [K]
//     layers.{l}.kvpop.mlstm.out_w       [K, P]       .out_b   [K]
//   sfc-gru (seed 004, the Latent Salience Forecaster; docs/policies/sfc.md),
//   G = hidden, Z = latent, F = 4 + Z features, one GRU per GQA group:
//     layers.{l}.sfc.latent   [K, hd, Z]   (key -> salience latent)
//     layers.{l}.sfc.w_ih     [K, 3G, F]   layers.{l}.sfc.b_ih  [K, 3G]  (gates r, z, n)
//     layers.{l}.sfc.w_hh     [K, 3G, G]   layers.{l}.sfc.b_hh  [K, 3G]
//     sfc_shared.head.weight  [2, G]       sfc_shared.head.bias [2]   (now, horizon)
//   qfilter (Q-Filters, Godey et al. 2025; docs/policies/qfilter.md), calibrated
//   from the model's queries, not trained, per layer l:
//     layers.{l}.qfilter      [K, hd]   (unit principal direction of the group's
//                                        post-RoPE queries, oriented with them)
//   query-stats (expected attention with calibrated statistics; kvpress
//   ExpectedAttentionStatsPress), H query heads, per layer l:
//     layers.{l}.query_mean   [H, hd]       (pre-RoPE queries, the first `sinks` of
//     layers.{l}.query_cov    [H, hd, hd]    each window left out; unbiased covariance)
//   restorekv (RestoreKV, arXiv 2608.01247; docs/policies/restorekv.md), n restore
//   tokens, LoRA rank r, I = the MLP's intermediate size, per layer l and
//   projection m in q, k, v, o, gate, up, down (in -> out):
//     restore_embeddings          [n, D]
//     layers.{l}.lora.{m}.a       [r, in]
//     layers.{l}.lora.{m}.b       [out, r]   (q: H*hd, k, v: K*hd, o: D <- H*hd,
//                                             gate, up: I, down: D <- I)
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/model/model_config.h"

namespace kvscope::gates {

// One entry each in gate_kinds.cpp's table (name, defaults, shapes, initialisation).
enum class GateKind {
  WriteGate,
  AttentionGate,
  Retention,
  RetentionGlobal,
  KvpopMlp,
  KvpopMlstm,
  SfcGru,
  QFilter,
  QueryStats,
  Kvzap,
  FastKvzip,
  Dms,
  RestoreKv,
};

// "wgkv", "attention-gate", "retention", "retention-global", "kvpop-mlp", "kvpop-mlstm",
// "sfc-gru", "qfilter", "query-stats", "kvzap", "fastkvzip", "dms",
// "restorekv".
const char* gate_kind_name(GateKind k);
// Throws InputError(file, field, ...) for an unknown name.
GateKind parse_gate_kind(const std::string& name, const std::string& file,
                         const std::string& field);

// What the gate networks need to know about the model.
struct GateShape {
  int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0, hidden_size = 0;
  int64_t n_heads = 0;   // query heads (query-stats)
  int64_t ffn_size = 0;  // the MLP's intermediate size (restorekv's LoRA)
  static GateShape of(const model::ModelConfig& c) {
    return {c.n_layers, c.n_kv_heads, c.head_dim, c.hidden_size, c.n_heads, c.intermediate_size};
  }
};

struct GateSet {
  GateKind kind = GateKind::WriteGate;
  GateShape shape;
  // {"format", "version", "policy", "hyperparameters", "base_model", "training"}
  nlohmann::json meta;
  std::map<std::string, torch::Tensor> params;
  std::string source;  // the file it was read from (for messages)

  double hyper(const std::string& key) const;  // throws when missing
  const torch::Tensor& param(const std::string& name) const;
  std::vector<torch::Tensor> trainable() const;  // every parameter, name order
  // Moves every parameter to `device` (the trainers initialise on the host,
  // then train where the model is).
  void to(torch::Device device);
};

// The hyperparameters of a kind with their defaults (the papers' and the
// official code's values), overridden by `given` (unknown keys are an
// InputError naming `field`).
nlohmann::json default_hyperparameters(GateKind kind, const GateShape& shape);
nlohmann::json resolve_hyperparameters(GateKind kind, const GateShape& shape,
                                       const nlohmann::json& given, const std::string& field);

// RestoreKV's LoRA targets in the order the fused weights stack them:
// q, k, v (wqkv), o, gate, up (w_up), down, each with its in and out size.
struct LoraProjection {
  const char* name;
  int64_t in, out;
};
std::vector<LoraProjection> restorekv_projections(const GateShape& shape);

// name -> shape of every parameter of a gate set of this kind for this model.
std::map<std::string, std::vector<int64_t>> expected_parameters(GateKind kind,
                                                                const nlohmann::json& hyper,
                                                                const GateShape& shape);

// Fresh parameters, initialised as the papers' code does (seeded).
GateSet init_gates(GateKind kind, const nlohmann::json& hyper, const GateShape& shape,
                   uint64_t seed);

// Writes `set` as a gate file (safetensors + embedded JSON metadata). The
// file appears complete or not at all (written beside, then renamed).
void save_gates(const GateSet& set, const std::string& path);

// Reads a gate file: a kvscope safetensors gate file, or an official
// checkpoint (WG-KV .pt, TrimKV trimkv_weights.pth or its directory; see
// official_checkpoints.h). Checks every tensor's shape against `model` and
// throws InputError listing all that does not fit.
GateSet load_gates(const std::string& path, const model::ModelConfig& model);

// Checks names and shapes of `set` against the model; throws InputError
// (file = set.source) listing every missing, extra or misshapen tensor.
void check_fits(const GateSet& set, const model::ModelConfig& model);

// SHA-256 of a file, lower-case hex (OpenSSL).
std::string file_sha256(const std::string& path);

}  // namespace kvscope::gates
