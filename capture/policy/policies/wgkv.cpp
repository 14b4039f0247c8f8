// wgkv: Write-Gated KV (Huang et al., "Learning What to Write: Write-Gated
// KV for Efficient Long-Context Inference", seed 000). A learned write gate
// g = sigmoid(MLP([RMSNorm(k_pre); RMSNorm(k_post)])) per (layer, kv head,
// token) decides admission to a persistent global cache beside a local
// window of the last W tokens (§3.1, §4):
//   prefill  the final W prompt tokens go to the local window; older tokens
//            go to the global cache iff g >= tau, else they are rejected
//            (seen only by the prompt queries within W of them: the
//            vertical-slash mask M_ij = [i - j < W] or [g_j >= tau], §4.2)
//   decode   the new token enters the local ring; the entry it overwrites
//            (position t - W) is promoted to the global cache iff its
//            g >= tau, else dropped (lazy promotion, §4.3). The window is
//            the last W tokens including the current one.
// Tiers: "global" (0, hotter) and "local" (1); promotion is a tier move.
// docs/policies/wgkv.md
#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "capture/gates/gate_nets.h"
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

constexpr int kGlobal = 0, kLocal = 1;
constexpr uint16_t kInWindow = 0, kAdmitGlobal = 1, kDrop = 2;

class WgkvPolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::key_pre_rope);
  }
  std::vector<PartKind> kinds() const override {
    return {PartKind::Admission, PartKind::Placement};
  }
  WgkvPolicy(std::string path, int64_t window, double tau)
      : path_(std::move(path)), W_(window), tau_(tau) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    gates_ = gates::load_gates(path_, *s.model);
    if (gates_.kind != gates::GateKind::WriteGate)
      throw InputError(path_, "policy",
                       std::string("wgkv needs write gates (kind wgkv); this file holds ") +
                           gates::gate_kind_name(gates_.kind) + " gates");
    if (W_ <= 0) W_ = int64_t(gates_.hyper("window"));
    if (tau_ < 0) tau_ = gates_.hyper("tau");
    g_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens,
              std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<cache::TierSpec> tiers() const override {
    return {{"global", cache::RowFormat::F32, true}, {"local", cache::RowFormat::F32, true}};
  }
  std::vector<std::string> reason_names() const override {
    return {"local window", "admit-global", "drop"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {
        {"write_gate",
         "WG-KV admission score g = sigmoid(MLP([RMSNorm(pre-RoPE key); RMSNorm(post-RoPE key)])); "
         "enters the global cache iff g >= threshold",
         "probability", tau_, false}};
  }
  std::string budget_kind() const override { return "none"; }

  void admit(AdmitContext& c) override {
    torch::NoGradGuard no_grad;
    torch::Tensor g =
        gates::wgkv_gate(gates_, c.layer, c.in.k_pre_rope, c.in.k).contiguous();  // [K, n]
    const float* gv = g.data_ptr<float>();
    // The local window is the last W tokens including the current one: after
    // this step, positions last - W + 1 .. last. Older prompt tokens are
    // decided now (admit-global or reject, seen only by the step's own queries
    // through the vertical-slash mask).
    const int64_t last = c.pos0 + c.n - 1;
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* gh = g_.at(c.layer, h);
      // Decode: the new token overwrites the ring's oldest entry (t - W),
      // which leaves before the query reads the ring.
      leave_ring(c.decide, c.layer, h, c.pos0);
      for (int64_t i = 0; i < c.n; ++i) {
        const int64_t p = c.pos0 + i;
        const float gp = gv[h * c.n + i];
        gh[p] = gp;
        c.decide.gate(0, c.layer, h, p, gp, false);
        if (last - p < W_)
          c.at(h, i) = {kLocal, false, gp, kInWindow};
        else if (gp >= tau_)
          c.at(h, i) = {kGlobal, false, gp, kAdmitGlobal};
        else
          c.at(h, i) = {kLocal, true, gp, kDrop};
      }
    }
  }

  // After a prefill chunk, the older chunks' ring entries that this chunk
  // pushed out of the window (they stayed visible to this chunk's queries
  // within W of them) leave too, so the ring holds exactly the last W.
  void after_attention(LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
      leave_ring(c.decide, c.layer, h, c.pos0 + c.n - 1);
  }

  // Several queries in one step (prefill): the vertical-slash mask. A decode
  // query reads exactly the two tiers, no mask needed.
  void select(SelectContext& c) override {
    if (c.n == 1) return;
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      const float* gh = g_.at(c.layer, h);
      const std::vector<int64_t>& cand = c.candidates[size_t(h)];
      const int64_t m = int64_t(cand.size());
      torch::Tensor mask = torch::ones({c.n, m}, torch::kBool);
      auto a = mask.accessor<bool, 2>();
      bool any = false;
      for (int64_t j = 0; j < m; ++j) {
        const int64_t p = cand[size_t(j)];
        if (gh[p] >= tau_) continue;  // global entries (and admissions to it) have g >= tau
        for (int64_t i = 0; i < c.n; ++i)
          if (c.pos0 + i - p >= W_) a[i][j] = false, any = true;
      }
      if (any) c.masks[size_t(h)] = mask;
    }
  }

  // Lazy promotion (§4.3): ring entries no query from `first` on reaches
  // through the window (first - p >= W) go to the global cache iff g >= tau, else for good.
  void leave_ring(Decisions& decide, int64_t layer, int64_t h, int64_t first) {
    const cache::RaggedKvCache& cache = decide.cache();
    const float* gh = g_.at(layer, h);
    std::vector<int32_t> local = cache.positions(layer, h, kLocal);
    std::sort(local.begin(), local.end());
    for (int32_t p : local) {
      if (first - p < W_) break;
      if (gh[p] >= tau_)
        decide.move(layer, h, p, kGlobal, gh[p], kAdmitGlobal);
      else
        decide.evict(layer, h, p, gh[p], kDrop);
    }
  }

  int64_t window() const { return W_; }
  double threshold() const { return tau_; }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"window", double(W_)}, {"tau", tau_}};
  }

 private:
  std::string path_;
  int64_t W_;
  double tau_;
  gates::GateSet gates_;
  HeadScores g_;
};

}  // namespace

PolicyDescriptor wgkv_descriptor() {
  PolicyDescriptor d = {
      "wgkv",
      "learned write gate: local window of W + global cache of tokens with g >= tau (lazy "
      "promotion)",
      "Huang et al., Learning What to Write: Write-Gated KV for Efficient Long-Context Inference "
      "(WG-KV), seed 000",
      "docs/policies/wgkv.md",
      {{"gates", ParamType::String, "",
        "gate file: kvscope .safetensors (wgkv) or an official WG-KV .pt"},
       {"window", ParamType::Int, "0",
        "W, the local window (0: the gate file's, 256 for official checkpoints)"},
       {"tau", ParamType::Float, "-1",
        "admission threshold (negative: the gate file's, 0.1 in the paper)", -1, 1}},
      [](const Params& p) {
        if (p.get_int("window") < 0) throw InputError("--policy", "wgkv:window", ">= 0 expected");
        if (p.get_float("tau") > 1)
          throw InputError("--policy", "wgkv:tau", "a threshold <= 1 expected");
        if (p.get_string("gates").empty())
          throw InputError(
              "--policy", "wgkv:gates",
              "a gate file is required (e.g. wgkv:gates=resources/gates/<model>-wgkv.safetensors)");
        return std::make_unique<WgkvPolicy>(p.get_string("gates"), p.get_int("window"),
                                            p.get_float("tau"));
      }};
  d.gate_kinds = {"wgkv"};
  return d;
}

}  // namespace kvscope::policy
