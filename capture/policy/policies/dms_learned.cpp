// dms_learned: Dynamic Memory Sparsification with its trained evictor
// (Łańcucki et al., "Inference-Time Hyper-Scaling with KV Cache Compression",
// NeurIPS 2025), in NVIDIA's adapter form (Model-Optimizer experimental/dms:
// a separate projection per layer, the base frozen). For each layer and kv
// head a decision logit z_t = scale * W_l h_t - offset comes from token t's
// normalised layer input; it decides about the previous token (the official
// code shifts the decisions by one, so a token is judged once its successor
// is known). Eviction is delayed: a token stays readable by the next `window`
// queries (i - j <= window) and leaves as the window moves past it iff its
// decision closed it (z > threshold). A multi-token step hides closed keys
// from its own queries past the window, as the official exact prefill does,
// so a chunked prefill, a one-step prefill and token-by-token decoding read
// the same keys. Trained by `kvscope train --policy dms`. docs/policies/dms_learned.md
#include <torch/torch.h>

#include <deque>
#include <limits>

#include "capture/gates/gate_nets.h"
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

constexpr uint16_t kClosed = 1;

class DmsLearnedPolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::hidden);
  }
  DmsLearnedPolicy(std::string path, int64_t window, double threshold)
      : path_(std::move(path)), W_(window), threshold_(threshold) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    gates_ = gates::load_gates(path_, *s.model);
    if (gates_.kind != gates::GateKind::Dms)
      throw InputError(path_, "policy",
                       std::string("dms_learned needs DMS decision gates (kind dms); this file "
                                   "holds ") +
                           gates::gate_kind_name(gates_.kind) + " gates");
    if (W_ <= 0) W_ = int64_t(gates_.hyper("window"));
    K_ = s.model->n_kv_heads;
    z_.resize(s.model->n_layers, K_, s.max_tokens, std::numeric_limits<float>::quiet_NaN());
    window_.assign(size_t(s.model->n_layers * K_), {});
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "closed by its DMS decision, evicted as it left the window"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"dms_decision",
             "DMS eviction logit of the token, z = scale * W h - offset from the next token's "
             "layer input; evicted when it leaves the window iff z > threshold",
             "logit", threshold_, false}};
  }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"window", double(W_)}};
  }

  // The step's logits decide about the tokens before them; a multi-token
  // step also hides closed keys from its queries past the window.
  void select(SelectContext& c) override {
    torch::NoGradGuard no_grad;
    torch::Tensor z =
        gates::dms_decision_logits(gates_, c.layer, c.in.hidden).contiguous();  // [K, n]
    const float* zp = z.data_ptr<float>();
    for (int64_t h = 0; h < K_; ++h) {
      float* zh = z_.at(c.layer, h);
      for (int64_t i = 0; i < c.n; ++i) {
        const int64_t judged = c.pos0 + i - 1;
        if (judged < 0) continue;
        zh[judged] = zp[h * c.n + i];
        c.decide.gate(0, c.layer, h, judged, zh[judged], false);
      }
      if (c.n > 1) mask_closed(c, h);
    }
  }

  // Tokens the window moved past leave if their decision closed them.
  void after_attention(LayerContext& c) override {
    for (int64_t h = 0; h < K_; ++h) {
      const float* zh = z_.at(c.layer, h);
      std::deque<int64_t>& q = window_[size_t(c.layer * K_ + h)];
      for (int64_t i = 0; i < c.n; ++i) q.push_back(c.pos0 + i);
      while (int64_t(q.size()) > W_) {
        const int64_t p = q.front();
        q.pop_front();
        if (closed(zh, p) && c.cache.holds(c.layer, h, p))
          c.decide.evict(c.layer, h, p, zh[p], kClosed);
      }
    }
  }

 private:
  // A decided token whose logit passes the threshold (NaN: not decided yet).
  bool closed(const float* zh, int64_t p) const { return zh[p] > threshold_; }

  void mask_closed(SelectContext& c, int64_t h) {
    const float* zh = z_.at(c.layer, h);
    const std::vector<int64_t>& cand = c.candidates[size_t(h)];
    torch::Tensor mask = torch::ones({c.n, int64_t(cand.size())}, torch::kBool);
    auto a = mask.accessor<bool, 2>();
    bool any = false;
    for (size_t j = 0; j < cand.size(); ++j) {
      const int64_t p = cand[j];
      if (!closed(zh, p)) continue;
      for (int64_t i = 0; i < c.n; ++i)
        if (c.pos0 + i - p > W_) a[i][int64_t(j)] = false, any = true;
    }
    if (any) c.masks[size_t(h)] = mask;
  }

  std::string path_;
  int64_t W_;
  double threshold_;
  int64_t K_ = 0;
  gates::GateSet gates_;
  HeadScores z_;                             // [layer][kv head][pos]: the decision logit
  std::vector<std::deque<int64_t>> window_;  // per (layer, kv head): the newest W tokens
};

}  // namespace

PolicyDescriptor dms_learned_descriptor() {
  PolicyDescriptor d = {
      "dms_learned",
      "DMS with its trained evictor: a learned decision per token and head, delayed eviction "
      "once the token leaves a window",
      "Łańcucki et al., Inference-Time Hyper-Scaling with KV Cache Compression (DMS), NeurIPS "
      "2025; NVIDIA Model-Optimizer experimental/dms",
      "docs/policies/dms_learned.md",
      {{"gates", ParamType::String, "",
        "DMS decision file (kvscope train --policy dms); default: the shipped one of the model"},
       {"window", ParamType::Int, "0",
        "w, queries that still read a token after it (0: the window the gates were trained with)",
        0},
       {"threshold", ParamType::Float, "0",
        "a token is closed when its decision logit is above this (0: the paper's z > 0)", -1e6,
        1e6}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("gates").empty())
          throw InputError("--policy", "dms_learned:gates",
                           "a DMS decision file is required (kvscope train --policy dms)");
        return std::make_unique<DmsLearnedPolicy>(p.get_string("gates"), p.get_int("window"),
                                                  p.get_float("threshold"));
      }};
  d.gate_kinds = {"dms"};
  return d;
}

}  // namespace kvscope::policy
