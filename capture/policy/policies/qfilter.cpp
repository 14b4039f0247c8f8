// qfilter: Q-Filters (Godey et al., "Q-Filters: Leveraging QK Geometry for
// Efficient KV Cache Compression", 2025; kvpress QFilterPress). Queries of a
// head concentrate along one direction u (the filter), so q.k is large for
// the keys with a large projection u.k: each head keeps the `budget` keys of
// largest u.k (as cached, after RoPE), without any attention. The filters are
// calibrated per model from its own queries (`kvscope train --policy qfilter`,
// qfilter_calibration.cpp; kvpress downloads them from the Hugging Face hub,
// which KVScope cannot reach) and found by the model's sha256 when `gates=` is
// not given. docs/policies/qfilter.md
#include <torch/torch.h>

#include "capture/gates/gate_set.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class QFilterScorer : public HeadScorer {
 public:
  explicit QFilterScorer(std::string path) : path_(std::move(path)) {}

  void setup(const PolicySetup& s) override {
    const gates::GateSet g = gates::load_gates(path_, *s.model);
    if (g.kind != gates::GateKind::QFilter)
      throw InputError(path_, "policy",
                       std::string("qfilter needs Q-Filters (kind qfilter); this file holds ") +
                           gates::gate_kind_name(g.kind) + " gates");
    filters_.clear();
    for (int64_t l = 0; l < s.model->n_layers; ++l)
      filters_.push_back(g.param("layers." + std::to_string(l) + ".qfilter").contiguous());
    proj_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
  }
  std::string score_name() const override { return "qfilter_projection"; }
  std::string score_meaning() const override {
    return "projection u.k of the cached key on the head's Q-Filter (higher = kept)";
  }
  // Every forward pass: a key's projection is its own, so keeping the best
  // chunk by chunk keeps the best of the whole prompt.
  bool compresses(const LayerContext&) const override { return true; }
  Subsets subsets() const override { return Subsets::Entry; }

  void observe(LayerContext& c) override {
    // [n, K, hd] . [K, hd] -> [n, K]
    torch::Tensor p =
        (c.in.k.to(torch::kFloat32) * filters_[size_t(c.layer)].unsqueeze(0)).sum(-1).contiguous();
    const float* pp = p.data_ptr<float>();
    const int64_t K = c.cache.n_kv_heads();
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < K; ++h) proj_.at(c.layer, h)[c.pos0 + i] = pp[i * K + h];
  }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* p = proj_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) out[pos] = p[pos];
  }

 private:
  std::string path_;
  std::vector<torch::Tensor> filters_;  // per layer [K, hd]
  HeadScores proj_;
};

}  // namespace

PolicyDescriptor qfilter_descriptor() {
  PolicyDescriptor d{
      "qfilter",
      "Q-Filters: keep the keys of largest projection on the head's calibrated query direction",
      "Godey et al., Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression, 2025 "
      "(kvpress QFilterPress)",
      "docs/policies/qfilter.md",
      {{"gates", ParamType::String, "",
        "Q-Filter file (kvscope train --policy qfilter); default: the shipped one of the model"},
       {"budget", ParamType::Int, "256", "entries kept per head"},
       {"decode", ParamType::Bool, "true", "also compress at every decode step"}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("gates").empty())
          throw InputError("--policy", "qfilter:gates",
                           "a Q-Filter file is required (kvscope train --policy qfilter)");
        if (p.get_int("budget") < 1) throw InputError("--policy", "qfilter:budget", "must be >= 1");
        return std::make_unique<ScoredPolicy>(
            std::make_unique<QFilterScorer>(p.get_string("gates")),
            std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
            "lowest Q-Filter projection");
      }};
  d.gate_kinds = {"qfilter"};
  return d;
}

}  // namespace kvscope::policy
