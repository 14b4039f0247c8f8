// attention_gate: in-context KV eviction by Attention-Gate (Zeng et al.,
// "In-context KV-Cache Eviction for LLMs via Attention-Gate", seed 001). Before
// each layer, a small attention module MHA' (h' heads) over the whole prompt
// gives every token a keep flag per kv head, flag = sigmoid(s + gamma) > tau
// (§3.3, Eq. 3-4). At prefill, a token with flag 0 is seen by no other query
// (its column of the attention is masked, the diagonal kept, Eq. 5) and is
// not cached; decoding appends every new token (§3.4: AG is not run at
// decode). The prompt must be prefilled in one step: the flags are computed
// from the whole prompt. docs/policies/attention_gate.md
#include <torch/torch.h>

#include <limits>

#include "capture/gates/gate_nets.h"
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class AttentionGatePolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::hidden);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Admission}; }
  AttentionGatePolicy(std::string path, double tau, double gamma)
      : path_(std::move(path)), tau_(tau), gamma_(gamma) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    gates_ = gates::load_gates(path_, *s.model);
    if (gates_.kind != gates::GateKind::AttentionGate)
      throw InputError(
          path_, "policy",
          std::string(
              "attention_gate needs Attention-Gate gates (kind attention-gate); this file holds ") +
              gates::gate_kind_name(gates_.kind) + " gates");
    if (tau_ < 0) tau_ = gates_.hyper("tau");
    if (std::isnan(gamma_)) gamma_ = gates_.hyper("gamma");
    keep_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens, 1.0f);
  }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"tau", tau_}, {"gamma", gamma_}};
  }
  std::vector<std::string> reason_names() const override {
    return {"new token", "flag 0 at prefill"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {
        {"keep_probability",
         "Attention-Gate keep probability sigmoid(s + gamma) of a prompt token at this kv head; "
         "flag 1 (cached) iff above the threshold",
         "probability", tau_, false}};
  }

  void admit(AdmitContext& c) override {
    if (!c.prefill) return;  // decoding appends
    if (c.pos0 != 0 || c.n != setup_.prompt_tokens)
      throw InputError(
          "--prefill-chunk", std::to_string(c.n),
          "attention_gate computes its flags over the whole prompt at once: prefill the " +
              std::to_string(setup_.prompt_tokens) +
              " prompt tokens in one step (--prefill-chunk " +
              std::to_string(setup_.prompt_tokens) + " or more)");
    torch::NoGradGuard no_grad;
    torch::Tensor prob =
        torch::sigmoid(gates::attention_gate_scores(gates_, c.layer, c.in.hidden) + gamma_)
            .contiguous();  // [K, n]
    const float* pv = prob.data_ptr<float>();
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* keep = keep_.at(c.layer, h);
      for (int64_t i = 0; i < c.n; ++i) {
        const float p = pv[h * c.n + i];
        const bool flag = p > tau_;
        keep[i] = flag ? 1.0f : 0.0f;
        c.decide.gate(0, c.layer, h, i, p, false);
        c.at(h, i) = flag ? Admission{0, false, p, 0} : Admission{0, true, p, 1};
      }
    }
  }

  // Prefill: a query reads the keys whose flag is 1, and itself (Eq. 5).
  void select(SelectContext& c) override {
    if (!c.prefill) return;
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      const float* keep = keep_.at(c.layer, h);
      const std::vector<int64_t>& cand = c.candidates[size_t(h)];
      torch::Tensor row = torch::empty({int64_t(cand.size())}, torch::kBool);
      bool any = false;
      for (size_t j = 0; j < cand.size(); ++j) {
        row[int64_t(j)] = keep[cand[j]] > 0.5f;
        any |= keep[cand[j]] <= 0.5f;
      }
      if (any) c.masks[size_t(h)] = row.unsqueeze(0).expand({c.n, int64_t(cand.size())}).clone();
    }
  }

 private:
  std::string path_;
  double tau_, gamma_;
  gates::GateSet gates_;
  HeadScores keep_;
};

}  // namespace

PolicyDescriptor attention_gate_descriptor() {
  PolicyDescriptor d = {
      "attention_gate",
      "learned keep flags per token and kv head from a small attention module over the prompt; "
      "evicted at prefill",
      "Zeng et al., In-context KV-Cache Eviction for LLMs via Attention-Gate, seed 001",
      "docs/policies/attention_gate.md",
      {{"gates", ParamType::String, "", "gate file: kvscope .safetensors (attention-gate)"},
       {"tau", ParamType::Float, "-1",
        "flag threshold on sigmoid(s + gamma) (negative: the gate file's)", -1, 1},
       {"gamma", ParamType::Float, "", "constant inside the sigmoid (unset: the gate file's)",
        -1000, 1000}},
      [](const Params& p) {
        if (p.get_string("gates").empty())
          throw InputError(
              "--policy", "attention_gate:gates",
              "a gate file is required (e.g. "
              "attention_gate:gates=resources/gates/<model>-attention-gate.safetensors)");
        if (p.get_float("tau") >= 1)
          throw InputError("--policy", "attention_gate:tau", "a threshold < 1 expected");
        return std::make_unique<AttentionGatePolicy>(p.get_string("gates"), p.get_float("tau"),
                                                     p.get_float("gamma"));
      }};
  d.gate_kinds = {"attention-gate"};
  return d;
}

}  // namespace kvscope::policy
