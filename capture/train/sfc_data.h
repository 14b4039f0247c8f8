// The training data of the Latent Salience Forecaster (seed 004; training
// section of docs/policies/sfc.md): full-cache traces captured with
// `--capture received`, the keys and queries recomputed by one causal pass of
// the frozen model over the trace's tokens, and the labels.
//
// Per trace, step s, group g = layer * K + kv head and token j (all tokens
// fed so far are held: a full cache):
//   r_j(s)       the received attention of the trace (mean over the step's
//                queries and the group's query heads)
//   tau(s, g)    the tau_quantile quantile of r(s) over the tokens held at s
//                (numpy's linear interpolation)
//   y_now(j, s)  r_j(s) > tau(s, g)
//   a_j(t)       the EWMA of r after step t - 1: a <- beta a + (1 - beta) r,
//                from 0, updated from the step that fed j on (what the sfc
//                policy keeps; x0 = log1p(a T))
//   y_hor(j, t)  any y_now(j, s) for s in [t, t + H - 1]; defined only when
//                t + H - 1 is a step of the trace
// A token's forecaster runs from the step after the one that fed it (prefill
// chunks are steps like decode steps).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "capture/generate/engine.h"

namespace kvscope::gates {

// The q quantile of v by linear interpolation between order statistics
// (numpy's default): v sorted, h = q (n - 1), v[floor h] + (h - floor h)
// (v[floor h + 1] - v[floor h]). v must not be empty.
double sfc_quantile(std::vector<float> v, double q);

// The labels of one step and group: tau = the q quantile of `mass` (the
// received attention of the held tokens) and y[j] = mass[j] > tau; returns tau.
float sfc_step_labels(const std::vector<float>& mass, double q, uint8_t* y);

// Horizon labels from the per-step labels y_now [S, ...] (any integer or
// bool type): y_hor[t] = any y_now[s], s in [t, t + H - 1], as uint8; rows
// t > S - H are 0 and `valid` marks the rows t <= S - H (bool [S]).
void sfc_horizon_labels(const torch::Tensor& y_now, int64_t horizon, torch::Tensor* y_hor,
                        torch::Tensor* valid);

// One full-cache trace, ready for the batched forecaster.
struct SfcSequence {
  std::string source;  // the trace file
  int64_t S = 0, T = 0, NG = 0, head_dim = 0;
  std::vector<int64_t> first;   // [S] first token of each step
  std::vector<int64_t> fed_at;  // [T] the step that fed each token
  torch::Tensor keys;           // [NG, T, hd] float32, post-RoPE (what the cache stores)
  torch::Tensor qmean;          // [NG, S, hd] mean of the group's query heads at the
                                // step's last query, post-RoPE
  torch::Tensor ewma;           // [S, NG, T] float32: a_j(t), 0 before the token was fed
  torch::Tensor y_now;          // [S, NG, T] uint8
  torch::Tensor tau;            // [S, NG] float32
  // Steps from which some token has a forecast: min(fed_at) + 1.
  int64_t first_forecast_step() const { return fed_at.empty() ? S : fed_at.front() + 1; }
};

struct SfcLabelOptions {
  double ewma = 0.8;          // beta
  double tau_quantile = 0.9;  // q
};

// What the traces say about their model, checked before the model loads.
struct SfcTraceHeader {
  std::string path;
  std::string model_name, model_path, model_sha256;
  int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, vocab_size = 0;
};

// Opens a trace and refuses (InputError naming the file and field) what
// cannot train the forecaster: another policy than full (/run policy_name),
// no received attention (/run capture_levels), fewer than two steps.
SfcTraceHeader check_sfc_trace(const std::string& path);

// The model of a trace: `model_override` (--model) or the trace's
// /run model_path; InputError(trace, "/run model_path") when neither exists.
std::string sfc_model_path(const SfcTraceHeader& h, const std::string& model_override);

// Refuses a trace of another model: /run model_sha256 when the trace has one
// (compared with the weight file's), else /run model_name and the shape
// (/run n_layers, ...). `model_file` is the file hashed.
void check_sfc_model(const SfcTraceHeader& h, const model::ModelConfig& c,
                     const std::string& model_file);

// Reads the received attention of every step and group into EWMAs and
// labels, and recomputes keys and queries by one causal pass of `model` over
// the trace's tokens. InputError when a step's received row is not a full
// cache's (/attention/received).
SfcSequence load_sfc_sequence(const std::string& path, model::Transformer& model,
                              const SfcLabelOptions& o);

// Per layer, the post-RoPE keys [T, K, hd] of every token and the queries
// [P, H, hd] at `query_positions`, float32, from one causal pass over `ids`
// (dense attention: every token sees every earlier one, as in a full cache).
struct SfcQk {
  std::vector<torch::Tensor> k, q;
};
SfcQk sfc_recompute_qk(model::Transformer& model, const std::vector<int64_t>& ids,
                       const std::vector<int64_t>& query_positions);

}  // namespace kvscope::gates
