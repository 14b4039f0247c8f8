// The step driver: runs one forward step's attention under a policy, over the
// ragged cache's storage. Per layer: admission (the policy decides a tier or a
// rejection for each new key), write, selection (masks over the attended
// entries), attention with the statistics the policy declared (and the
// observer's weights), rejection of the step-only entries, eviction and
// placement; after the last layer the policy's global end-of-step decisions.
// Decisions go through policy::Decisions, which checks, applies and records
// them; the driver checks the held-entry limits the policy declares.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "capture/attention/device_attention.h"
#include "capture/cache/layer_stats.h"
#include "capture/cache/ragged_cache.h"
#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/policy/decisions.h"
#include "capture/policy/policy.h"

namespace kvscope::policy {

class StepDriver : public model::AttentionBackend {
 public:
  struct Options {
    int64_t page_rows = 16;
    int64_t max_tokens = 0;     // positions the run may reach
    int64_t prompt_tokens = 0;  // the prompt's length (prefill ends there)
    // How full-precision tiers store rows (--kv-dtype): F32, BF16 or F16.
    cache::RowFormat kv_format = cache::RowFormat::F32;
    // A replay's interventions (interventions.h; outlive the driver): the
    // cache gains the "kept" tier after the policy's when they keep anything.
    const Interventions* interventions = nullptr;
  };

  // The cache's tiers: the policy's, then "kept" when `options` keeps anything.
  static std::vector<cache::TierSpec> tiers_of(const Policy& policy, const Options& options);
  // The reason names the trace records: the policy's, then the interventions'
  // two ("kept by intervention", "dropped by intervention") when there are any.
  static std::vector<std::string> reason_names_of(const Policy& policy, const Options& options);

  // `policy` must be set up; `name` names it in errors (its spec name).
  StepDriver(const model::ModelConfig& config, const Options& options, Policy& policy,
             const std::string& name);

  void set_observer(cache::AttentionObserver* observer) { observer_ = observer; }
  // --device cuda: the model's tensors arrive on `device`. The cache's
  // attended pages are mirrored there and layers are attended by the CUDA
  // kernels (capture/attention/device_attention.h) unless a step needs the
  // weights themselves (a selection mask, an observer that wants them, a
  // reconstruction pass); those layers run the host kernels over the host
  // pages, which stay the truth. Caches the kernels cannot read (several
  // attended tiers, an INT4 tier) are attended there by the blocked path
  // (attention/blocked_attention.h), prefill and decode; pruned keys (ThinK) on
  // the host.
  // Policies always see host tensors. `prefill`: how prefill chunks are
  // attended there (cache::DevicePrefill). On the CPU, Blocked attends the
  // prefill chunks that fit by the same tensor code over the host pages
  // (attention/blocked_attention.h): what a GPU would run, checked here.
  void use_device(torch::Device device,
                  cache::DevicePrefill prefill = cache::DevicePrefill::Kernel);
  // Layers attended by the device kernels, by the blocked path (on the
  // device, or the prefill on the host pages) and by the host kernels so far.
  int64_t device_layers() const { return device_layers_; }
  int64_t blocked_layers() const { return blocked_layers_; }
  int64_t host_layers() const { return host_layers_; }
  // The policy's context-reconstruction pass (CapturePlan::reconstruction): side
  // steps feed these chunks in order; options.max_tokens must cover the
  // positions they use.
  void set_reconstruction(std::vector<ReconstructionChunk> plan) { plan_ = std::move(plan); }

  // AttentionBackend
  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;
  void end_step() override;
  bool set_side_pass(bool on) override;
  bool set_probe_pass(bool on) override;
  // The current step is a reconstruction step (its chunk: reconstruction_chunk()).
  bool side_step() const { return side_index_ >= 0 && side_; }
  int64_t reconstruction_chunk() const { return side_index_; }

  const cache::RaggedKvCache& cache() const { return cache_; }
  // Direct storage access for tests and tools outside a policy's hooks.
  cache::RaggedKvCache& storage() { return cache_; }
  int64_t step() const { return step_; }
  int64_t tokens_fed() const { return pos0_ + n_; }  // after the current step
  // Attention statistics of the layer's last attention (what the policy asked for).
  const cache::LayerStats& stats(int64_t layer) const { return stats_[size_t(layer)]; }
  // Wall time spent inside the policy's hooks since construction.
  double policy_seconds() const { return policy_seconds_; }

  std::vector<trace::Event> take_events() { return decide_.take_events(); }
  std::vector<trace::GateValue> take_gates() { return decide_.take_gates(); }
  // The step's series values (Decisions::take_series): take them before the next step.
  std::vector<float> take_series() { return decide_.take_series(); }
  // The stalls recorded since the last take (Decisions::take_stalls).
  std::vector<trace::StallRow> take_stalls() { return decide_.take_stalls(); }
  // The merges recorded since the last take (Decisions::take_merges).
  std::vector<trace::MergeRow> take_merges() { return decide_.take_merges(); }
  std::vector<trace::RerotationRow> take_rerotations() { return decide_.take_rerotations(); }
  std::vector<trace::KeyChannelRow> take_key_channels() { return decide_.take_key_channels(); }
  std::vector<trace::InterventionRow> take_interventions() { return decide_.take_interventions(); }
  // The tier interventions keep entries in (-1: none).
  int kept_tier() const { return kept_tier_; }

 private:
  void write_new_entries(const model::AttentionInputs& in, const std::vector<Admission>& adm);
  torch::Tensor attend_heads(const model::AttentionInputs& in, const torch::Tensor& queries,
                             const std::vector<std::vector<int64_t>>& key_pos_by_head,
                             std::vector<torch::Tensor>& masks);
  bool statistics_suffice(int64_t layer, const std::vector<torch::Tensor>& masks) const;
  cache::DeviceStatsWanted wanted_statistics(int64_t layer, int64_t n) const;
  torch::Tensor take_statistics(int64_t layer, int64_t n, const cache::DeviceStatsWanted& want,
                                const cache::DeviceLayerAttention& r);
  torch::Tensor attend_on_device(const model::AttentionInputs& in);
  torch::Tensor attend_blocked(const model::AttentionInputs& in);
  void check_limits(const LayerContext& c) const;
  torch::Tensor attend_side(const model::AttentionInputs& in);
  torch::Tensor attend_probe(const model::AttentionInputs& in);
  void apply_drops(const LayerContext& c);

  Options options_;
  Policy& policy_;
  cache::RaggedKvCache cache_;
  Decisions decide_;
  cache::StatsNeeds needs_;
  std::vector<cache::LayerStats> stats_;
  cache::AttentionObserver* observer_ = nullptr;
  int64_t L_, K_, H_, R_, hd_;
  int64_t step_ = -1, pos0_ = 0, n_ = 0;
  double policy_seconds_ = 0;
  std::vector<ReconstructionChunk> plan_;
  int device_tier_ = -1;  // the tier the device kernels read, -1: host attention only
  // The tiers the blocked path reads: on a GPU when the kernels cannot
  // (device_tier_ < 0), on the CPU with --device-prefill blocked; empty: none.
  std::vector<int> blocked_tiers_;
  cache::DevicePrefill prefill_ = cache::DevicePrefill::Kernel;
  int64_t device_layers_ = 0, blocked_layers_ = 0, host_layers_ = 0;
  int kept_tier_ = -1;  // interventions keep entries there (-1: none)
  bool probe_ = false;  // the steps being fed are probe steps (set_probe_pass)
  int64_t probe_pos0_ = 0;
  bool side_ = false;        // the steps being fed are reconstruction steps
  int64_t side_index_ = -1;  // chunk of the current (or last) reconstruction step
};

}  // namespace kvscope::policy
