// fastkvzip: Fast KVzip (Kim, Han, Yun, "Fast KVzip: Efficient and Accurate
// LLM Inference with Gated KV Eviction", 2026; kvpress FastKVzipPress). A
// small trained gate per layer (capture/gates/fastkvzip_gate.h) scores every
// prompt entry from the token's normalised layer input, in place of KVzip's
// second forward pass; the first `sinks` and the last max(1, floor(ratio T))
// positions (`window` past 32K tokens) score 1. After the prefill the
// L*K*(T - budget) lowest scores over all layers and heads are evicted
// (layerwise: K*(T - budget) per layer), KVzip's selection. The gates are
// trained per model by `kvscope train --policy fastkvzip`
// (fastkvzip_training.cpp). docs/policies/fastkvzip.md
#include <algorithm>
#include <vector>

#include "capture/gates/fastkvzip_gate.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/kvzip_selection.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class FastKvzipPolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::hidden);
  }
  FastKvzipPolicy(std::string gates, int64_t budget, int64_t sinks, double window_ratio,
                  int64_t window, bool layerwise)
      : path_(std::move(gates)),
        budget_(budget),
        sinks_(sinks),
        window_ratio_(window_ratio),
        window_(window),
        layerwise_(layerwise) {}

  std::vector<std::string> reason_names() const override {
    return {"new token", "lowest Fast KVzip gate score"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"fastkvzip",
             "Fast KVzip gate score: the trained gate's estimate of the entry's KVzip score from "
             "its layer input (sinks and the local window: 1)",
             "probability"}};
  }
  std::string budget_kind() const override { return layerwise_ ? "layer" : "global"; }
  int64_t budget() const override {
    if (!setup_.model) return budget_;
    return budget_ * setup_.model->n_kv_heads * (layerwise_ ? 1 : setup_.model->n_layers);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::string describe() const override {
    return "trained gates score the prompt's entries; " +
           std::string(layerwise_ ? "K*budget per layer" : "L*K*budget over all layers and heads");
  }

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    const gates::GateSet g = gates::load_gates(path_, *s.model);
    if (g.kind != gates::GateKind::FastKvzip)
      throw InputError(path_, "policy",
                       std::string("fastkvzip needs Fast KVzip gates (kind fastkvzip); this file "
                                   "holds ") +
                           gates::gate_kind_name(g.kind) + " gates");
    layers_.clear();
    for (int64_t l = 0; l < s.model->n_layers; ++l) layers_.push_back(gates::fastkvzip_layer(g, l));
    dim_ = int64_t(g.hyper("dim"));
    T_ = s.prompt_tokens;
    scores_.assign(size_t(s.model->n_layers * s.model->n_kv_heads * T_), 0.0f);
  }

  // The prompt's entries, as their tokens are fed (chunked prefills included).
  void after_attention(LayerContext& c) override {
    if (c.reconstruction >= 0 || c.pos0 >= T_) return;
    const int64_t K = c.cache.n_kv_heads(), G = c.cache.n_heads() / K;
    const int64_t n = std::min(c.n, T_ - c.pos0);
    torch::NoGradGuard no_grad;
    const torch::Tensor s =
        gates::fastkvzip_forward(layers_[size_t(c.layer)],
                                 c.in.hidden.to(torch::kFloat32).narrow(0, 0, n), K, G, dim_)
            .contiguous();
    const float* sp = s.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < K; ++h)
        scores_[size_t((c.layer * K + h) * T_ + c.pos0 + i)] = sp[i * K + h];
  }

  void end_step(StepContext& c) override {
    if (c.reconstruction >= 0 || !c.prompt_complete || done_) return;
    done_ = true;
    const int64_t L = c.cache.n_layers(), K = c.cache.n_kv_heads();
    // kvpress: window_ratio of the context below 32000 tokens (at least 1), else window.
    const int64_t local =
        T_ < 32000 ? std::max<int64_t>(1, int64_t(double(T_) * window_ratio_)) : window_;
    for (int64_t i = 0; i < L * K; ++i) {
      float* row = scores_.data() + i * T_;
      for (int64_t p = 0; p < std::min(sinks_, T_); ++p) row[p] = 1.0f;
      for (int64_t p = std::max<int64_t>(0, T_ - local); p < T_; ++p) row[p] = 1.0f;
    }
    record_and_evict_lowest(c.decide, scores_, L, K, T_, budget_, layerwise_);
  }

 private:
  std::string path_;
  int64_t budget_, sinks_;
  double window_ratio_;
  int64_t window_;
  bool layerwise_;
  std::vector<gates::FastKvzipLayer> layers_;
  int64_t dim_ = 16, T_ = 0;
  bool done_ = false;
  std::vector<float> scores_;  // [L][K][T]
};

}  // namespace

PolicyDescriptor fastkvzip_descriptor() {
  PolicyDescriptor d{
      "fastkvzip",
      "Fast KVzip: trained gates estimate each prompt entry's KVzip score from its layer input "
      "(no second pass); evict the lowest over all heads",
      "Kim, Han, Yun, Fast KVzip: Efficient and Accurate LLM Inference with Gated KV Eviction, "
      "2026 (kvpress FastKVzipPress)",
      "docs/policies/fastkvzip.md",
      {{"gates", ParamType::String, "",
        "Fast KVzip gate file (kvscope train --policy fastkvzip); default: the shipped one of the "
        "model"},
       {"budget", ParamType::Int, "256",
        "entries kept per (layer, kv head) on average: L*K*budget in all (a fraction of the "
        "prompt: budget=0.25)",
        1},
       {"sinks", ParamType::Int, "4", "first positions never evicted (kvpress n_sink)", 0},
       {"window_ratio", ParamType::Float, "0.02",
        "share of the prompt at its end never evicted, at least 1 entry (kvpress window_ratio)", 0,
        1},
       {"window", ParamType::Int, "4096",
        "entries at the prompt's end never evicted from 32000 prompt tokens on (kvpress "
        "window_size)",
        0},
       {"layerwise", ParamType::Bool, "false",
        "each layer keeps K*budget (kvpress layerwise) instead of one ranking over all layers"}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("gates").empty())
          throw InputError("--policy", "fastkvzip:gates",
                           "a Fast KVzip gate file is required (kvscope train --policy fastkvzip)");
        return std::make_unique<FastKvzipPolicy>(p.get_string("gates"), p.get_int("budget"),
                                                 p.get_int("sinks"), p.get_float("window_ratio"),
                                                 p.get_int("window"), p.get_bool("layerwise"));
      }};
  d.gate_kinds = {"fastkvzip"};
  return d;
}

}  // namespace kvscope::policy
