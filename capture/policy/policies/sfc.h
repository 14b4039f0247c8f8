// sfc: the Salience Forecasting Cache (seed 004); the policy class, public so
// that tests can script its forecasts (predict). See sfc.cpp and
// docs/policies/sfc.md.
#pragma once

#include <torch/types.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capture/gates/sfc_forecaster.h"
#include "capture/policy/policy.h"
#include "capture/tiering/hot_budget.h"
#include "capture/tiering/transfer_link.h"

namespace kvscope::policy {

namespace sfc {
constexpr int kHot = 0, kWarm = 1, kCold = 2;
constexpr uint16_t kNewToken = 0, kLanded = 1, kReactive = 2, kWarmUp = 3, kHotDown = 4,
                   kColdDown = 5, kEvicted = 6;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct SfcSpec {
  std::string gates;
  double hot = 0.25, warm = 0.25;
  int64_t sinks = 4, window = 16;
  double up = 0.5, down = 0.3, now = 0.5;
  int64_t rebalance = 128;
  std::string forecast = "gru", budgets = "volatility", demote = "cold";
  bool speculate = true;
  tiering::LinkSpec link;
  double sample = 0.05;  // forecast change that records a new gate sample
};

// What the policy knows of the tokens of one layer, per kv head and
// position ([K, M], M the positions the run may reach): the SFC never
// evicts, so every head of a layer holds positions 0 .. T-1 and the
// forecaster runs over dense [K, T] slices, batched (one GRU step per layer).
struct LayerState {
  torch::Tensor hidden;            // [K, M, G] GRU state (0 until the token's first step)
  torch::Tensor z_key;             // [K, M, Z] the key's salience latent
  torch::Tensor key_norm;          // [K, M]
  torch::Tensor ewma, acc;         // [K, M] received attention: EWMA and sum
  torch::Tensor p_now, p_hor;      // [K, M] this step's forecasts (NaN before the first)
  torch::Tensor mom_mean, mom_sq;  // [K, M] recent forecasts' moments (NaN: none yet)
  torch::Tensor sampled;           // [K, M] the last gate sample (NaN: none)
  std::vector<int32_t> landing;    // [K * M] step a prefetch lands, -1 when none in flight
  std::vector<int8_t> target;      // [K * M] the tier a cold token's prefetch lands in
};

class SfcPolicy : public Policy {
 public:
  explicit SfcPolicy(SfcSpec spec) : spec_(std::move(spec)), link_(spec_.link) {}
  std::vector<PartKind> kinds() const override {
    return {PartKind::Admission, PartKind::Eviction, PartKind::Placement};
  }
  void setup(const PolicySetup& s) override;
  std::vector<cache::TierSpec> tiers() const override {
    return {{"hot", cache::RowFormat::F32, true},
            {"warm", cache::RowFormat::Int4, true},
            {"cold", cache::RowFormat::F32, false}};
  }
  std::vector<std::string> reason_names() const override {
    return {"new token (hot)",
            "promoted: prefetch landed (speculative, in time)",
            "promoted: reactive fetch (the step stalled)",
            "promoted: forecast crossed up (warm -> hot)",
            "demoted: forecast below down or over the hot budget (-> warm)",
            "demoted: below the warm budget (-> cold)",
            "evicted: below the warm budget (ablation demote=evict)"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"sfc_forecast",
             spec_.forecast == "gru"
                 ? "forecast P(attention above the head's 0.9 quantile within the next H steps), "
                   "sampled when it moved by `sample`"
                 : "ablation forecast=accumulated: u / (1 + u), u = mean received attention "
                   "relative to uniform",
             "probability", spec_.up, true}};
  }
  std::vector<trace::SeriesSpec> series() const override {
    return {{"sfc_hot_budget", "hot-tier (T0) entries the head may hold after the step", "entries"},
            {"sfc_volatility",
             "the head's forecast volatility at the last rebalance (mean per-token variance)",
             "probability^2"}};
  }
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n;
    n.received = true;
    n.query = true;  // the forecaster reads the step's last query
    return n;
  }
  std::string budget_kind() const override { return "layer"; }
  int64_t budget() const override {
    return layer_hot(setup_.max_tokens) + K_ * warm_budget(setup_.max_tokens);
  }
  HeldLimit held_limit(const LayerContext& c) const override {
    if (spec_.demote == "evict") return {-1, -1};  // evicted tokens are not held at all
    return {-1, layer_hot(c.tokens_fed()) + K_ * warm_budget(c.tokens_fed())};
  }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"horizon", double(cfg_.horizon)},
            {"transfer_modelled", 1.0},
            {"row_bytes", double(row_bytes_)},
            {"prefetch_lead_steps", double(lead_steps_)}};
  }
  std::string describe() const override {
    return "Salience Forecasting Cache: hot " + std::to_string(spec_.hot) + " / warm " +
           std::to_string(spec_.warm) + " of the tokens per head, cold unbounded (not attended); " +
           (spec_.forecast == "gru" ? "GRU forecaster" : "accumulated attention (ablation)") +
           ", budgets by " + spec_.budgets + (spec_.speculate ? ", speculative prefetch" : "");
  }

  void admit(AdmitContext& c) override;
  void after_attention(LayerContext& c) override;
  void end_step(StepContext& c) override;

 protected:
  // This step's forecasts of every token the layer holds, before its
  // attention: fills p_now and p_hor [K, T] (T = c.pos0, the tokens fed
  // before the step). The GRU's (one batched step; it sees the step's
  // query), or the accumulated-attention ablation's; tests script it.
  virtual void predict(const AdmitContext& c, torch::Tensor p_now, torch::Tensor p_hor);
  const SfcSpec& spec() const { return spec_; }

 private:
  float at(const torch::Tensor& t, int64_t h, int64_t pos) const {
    return t.data_ptr<float>()[h * M_ + pos];
  }
  int32_t& landing(int64_t layer, int64_t h, int64_t pos) {
    return state_[size_t(layer)].landing[size_t(h * M_ + pos)];
  }
  // Where in a step layer `l` attends, for the link model.
  double phase(int64_t l) const { return double(l) / double(L_); }
  int64_t pinned(int64_t T) const { return std::min(T, spec_.sinks + spec_.window); }
  bool is_pinned(int64_t pos, int64_t T) const {
    return pos < spec_.sinks || pos >= T - spec_.window;
  }
  int64_t layer_hot(int64_t T) const {
    return std::max(int64_t(std::llround(spec_.hot * double(T) * double(K_))), K_ * pinned(T));
  }
  int64_t warm_budget(int64_t T) const { return int64_t(std::llround(spec_.warm * double(T))); }

  void land_prefetches(AdmitContext& c);
  void forecast(AdmitContext& c);
  void fetch_reactively(AdmitContext& c);
  void update_attention(LayerContext& c);
  void place(LayerContext& c, int64_t h, int64_t hot_budget);

  SfcSpec spec_;
  tiering::TransferLink link_;
  bool gru_ = false;         // a forecaster file was loaded
  gates::SfcParams params_;  // its parameters, stacked over the groups [L * K, ...]
  gates::SfcConfig cfg_;
  int64_t L_ = 0, K_ = 0, R_ = 0, M_ = 0, G_ = 0, Z_ = 0, hd_ = 0;
  int64_t row_bytes_ = 0, lead_steps_ = 1;
  std::vector<LayerState> state_;   // per layer
  std::vector<int32_t> born_;       // [M] the step that fed each position
  std::vector<double> volatility_;  // [L, K] at the last rebalance
};

}  // namespace sfc

}  // namespace kvscope::policy
