// The oracle shadow: a full-cache run teacher-forced on the tokens the policy
// run fed, step by step, and what it says about the policy (/oracle):
//   kl         KL(p_full || p_policy) of the next-token distributions
//   lost_mass  per (layer, query head): attention the full-cache query puts
//              on keys the policy's query could not read (not held at
//              attention time)
//   recall     per (layer, kv head): share of the full cache's top-k attended
//              keys (mean over the group's heads) the policy still holds
//              after the step (seed 003's oracle recall)
// All three use the step's last query (the only one in a decode step), and so
// does needed(), the oracle's verdict on a stall (/stalls needed).
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/model/transformer.h"
#include "capture/policy/registry.h"
#include "capture/recorder/recorder.h"
#include "core/trace/types.h"

namespace kvscope::recorder {

// The quantile of a head's full-cache attention row that an entry must reach
// to count as needed: "above the head's 90th percentile", the salience
// threshold tau of the Salience Forecasting Cache (seed 004).
inline constexpr double kNeededQuantile = 0.9;

// Is x at or above the q-quantile of w? The quantile interpolates linearly
// between the order statistics (numpy's default): with w sorted ascending,
// h = q (n - 1), it is w[floor h] + (h - floor h) (w[floor h + 1] - w[floor h]).
// False for an empty w.
bool above_quantile(const std::vector<float>& w, float x, double q);

class OracleShadow : public cache::AttentionObserver {
 public:
  // The shadow attends where the policy's driver does (StepDriver::use_device:
  // on a GPU the device kernels, with --device-prefill its prefill way), and
  // needs of each head only its last query's weights per query head.
  OracleShadow(model::Transformer& model, const policy::StepDriver::Options& options,
               int64_t recall_k, const Recorder& policy_recorder,
               const cache::RaggedKvCache& policy_cache, torch::Device device = torch::kCPU,
               cache::DevicePrefill prefill = cache::DevicePrefill::Kernel);

  // Runs the full-cache forward for the step's tokens and compares.
  trace::OracleRow step(const torch::Tensor& ids, int64_t pos0, const torch::Tensor& policy_logits);

  // Only the step's last query is compared; other blocks are skipped.
  bool wants_probs(int64_t) const override { return true; }
  void on_attention_begin(int64_t layer, int64_t kv_head, int64_t R, int64_t n, int64_t m,
                          const int64_t* key_pos, int64_t q_pos0) override;
  void on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) override;
  void on_attention_end() override {}
  // On a device layer: the last query's weights alone, no mass.
  bool needs_weights(int64_t) const override { return false; }
  bool wants_mass(int64_t) const override { return false; }
  bool wants_last_query(int64_t) const override { return true; }
  void on_attention_last_query(const float* weights) override;

  // The oracle's verdict on a stall of the step just compared (call after
  // step()): 1 when the full cache's last query put at least the
  // kNeededQuantile quantile of head (layer, kv_head)'s weights on `token`
  // (mean over the group's query heads), 0 below, -1 when the head or token
  // is not in the row.
  int8_t needed(int64_t layer, int64_t kv_head, int64_t token) const;

  // The shadow's driver (where its layers were attended).
  const policy::StepDriver& driver() const { return *shadow_; }

 private:
  // The last query's weights on keys k0 .. k0 + mk of the observed head:
  // query head r's row at w + r * stride.
  void take_last_query(const float* w, int64_t stride, int64_t mk, int64_t k0);

  model::Transformer& model_;
  policy::PolicyInstance full_;
  std::unique_ptr<policy::StepDriver> shadow_;
  int64_t recall_k_;
  const Recorder& policy_recorder_;
  const cache::RaggedKvCache& policy_cache_;
  int64_t L_, H_, K_, R_;
  std::vector<float> lost_;                                       // [L*H]
  std::vector<std::vector<std::pair<float, int64_t>>> last_row_;  // [L*K]: (weight, position)
  int64_t layer_ = 0, kv_head_ = 0, n_ = 0;                       // the head being observed
  const int64_t* key_pos_ = nullptr;
};

}  // namespace kvscope::recorder
