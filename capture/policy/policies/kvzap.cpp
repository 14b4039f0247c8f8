// kvzap: KVzap (Jegou et al., "KVzap: Fast, Adaptive, and Faithful KV Cache
// Pruning", 2026; kvpress KVzapPress). A small surrogate per layer predicts,
// from the token's normalised layer input h_j alone, the log of the KVzip+
// score the entry would get from a context-reconstruction pass:
//   s(l, k, j) = W_l[k] . h_j + b_l[k].
// No attention and no second pass: the score is known as soon as the token
// is, so it serves the prefill, the decode and a threshold (dms:scorer=kvzap,
// the paper's inference strategy). The surrogates are fitted per model by
// `kvscope train --policy kvzap` (kvzap_calibration.cpp; kvpress downloads
// NVIDIA's from the Hugging Face hub, which KVScope cannot reach and which
// exist only for 8B-class models). docs/policies/kvzap.md
#include <torch/torch.h>

#include "capture/gates/gate_set.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class KvzapScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::hidden);
  }
  // sinks, window: the first and the newest entries of each head, never
  // evicted (both 0 as a wrapper's scorer, where the wrapper protects).
  KvzapScorer(std::string path, std::string field, int64_t sinks, int64_t window)
      : path_(std::move(path)), field_(std::move(field)), sinks_(sinks), window_(window) {}

  void setup(const PolicySetup& s) override {
    if (path_.empty())
      throw InputError("--policy", field_,
                       "a KVzap surrogate file is required (kvscope train --policy kvzap)");
    const gates::GateSet g = gates::load_gates(path_, *s.model);
    if (g.kind != gates::GateKind::Kvzap)
      throw InputError(path_, "policy",
                       std::string("kvzap needs a KVzap surrogate (kind kvzap); this file holds ") +
                           gates::gate_kind_name(g.kind) + " gates");
    weight_.clear();
    bias_.clear();
    for (int64_t l = 0; l < s.model->n_layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".kvzap.";
      weight_.push_back(g.param(p + "weight").to(torch::kFloat32).t().contiguous());  // [D, K]
      bias_.push_back(g.param(p + "bias").to(torch::kFloat32).contiguous());          // [K]
    }
    pred_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
  }
  std::string score_name() const override { return "kvzap_log_score"; }
  std::string score_meaning() const override {
    return "the KVzap surrogate's prediction of log KVzip+ score from the token's layer input "
           "(higher = kept)";
  }
  bool log_scores() const override { return true; }
  Protection protection() const override { return {sinks_, window_}; }
  Subsets subsets() const override { return Subsets::Entry; }

  void observe(LayerContext& c) override {
    const size_t l = size_t(c.layer);
    torch::Tensor s =
        torch::addmm(bias_[l], c.in.hidden.to(torch::kFloat32), weight_[l]).contiguous();  // [n, K]
    const float* sp = s.data_ptr<float>();
    const int64_t K = c.cache.n_kv_heads();
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < K; ++h) pred_.at(c.layer, h)[c.pos0 + i] = sp[i * K + h];
  }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* p = pred_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) out[pos] = p[pos];
  }

 private:
  std::string path_, field_;
  int64_t sinks_, window_;
  std::vector<torch::Tensor> weight_, bias_;  // per layer [D, K], [K]
  HeadScores pred_;
};

std::unique_ptr<HeadScorer> make_kvzap(const Params& p, int64_t sinks, int64_t window) {
  return std::make_unique<KvzapScorer>(p.get_string("gates"), "kvzap:gates", sinks, window);
}

const ParamSpec kGatesParam{"gates", ParamType::String, "",
                            "KVzap surrogate file (kvscope train --policy kvzap); default: the "
                            "shipped one of the model"};

}  // namespace

ScorerDescriptor kvzap_scorer() {
  return {"kvzap", {kGatesParam}, [](const Params& p) { return make_kvzap(p, 0, 0); }};
}

PolicyDescriptor kvzap_descriptor() {
  PolicyDescriptor d{
      "kvzap",
      "KVzap: keep the entries whose layer input a fitted surrogate rates highest (predicted "
      "log KVzip+ score)",
      "Jegou et al., KVzap: Fast, Adaptive, and Faithful KV Cache Pruning, 2026 (kvpress "
      "KVzapPress)",
      "docs/policies/kvzap.md",
      {kGatesParam,
       {"budget", ParamType::Int, "256", "entries kept per head"},
       {"sinks", ParamType::Int, "4",
        "first positions never evicted (KVScope's choice, as KVzip's n_sink: the surrogate cannot "
        "tell the attention sink at layer 0)",
        0},
       {"window", ParamType::Int, "128",
        "newest entries per head never evicted (the paper's sliding window; 0: kvpress "
        "KVzapPress alone)",
        0},
       {"decode", ParamType::Bool, "true",
        "also compress at every decode step (false: the prefill only, kvpress ScorerPress)"}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_int("budget") < 1) throw InputError("--policy", "kvzap:budget", "must be >= 1");
        return std::make_unique<ScoredPolicy>(
            make_kvzap(p, p.get_int("sinks"), p.get_int("window")),
            std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
            "lowest predicted log KVzip+ score");
      }};
  d.gate_kinds = {"kvzap"};
  return d;
}

}  // namespace kvscope::policy
