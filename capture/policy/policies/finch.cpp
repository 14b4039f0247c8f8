// finch: FINCH (Corallo & Papotti, "FINCH: Prompt-guided Key-Value Cache
// Compression for Large Language Models", TACL 2024; kvpress FinchPress). The
// prompt is a context followed by a question of `window` tokens; the
// question's queries vote for the context's keys:
//   s(j) = mean over the window's queries i and the group's query heads of
//          p_i * softmax_k(q_i . k_k * scale)[j]      (causal: k <= p_i)
// where p_i is query i's position (kvpress's normalize_scores: a query at p
// spreads its mass over p + 1 keys, and the factor puts the window's rows on
// one scale; normalize=false drops it). No pooling (unlike SnapKV). The window
// is always kept, each head keeps its top (budget - window) context keys, and
// the kept keys are re-rotated to RoPE positions 0..n-1 (rerotate=true, as
// FINCH and kvpress). Prefill only: FINCH compresses the context for its
// question. docs/policies/finch.md
#include <torch/torch.h>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class FinchScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  FinchScorer(int64_t window, bool normalize) : window_(window), normalize_(normalize) {}

  void setup(const PolicySetup& s) override {
    if (s.prompt_tokens > 0 && s.prompt_tokens <= window_)
      throw InputError("--policy", "finch:window",
                       "the question window (" + std::to_string(window_) +
                           " tokens) must be shorter than the prompt (" +
                           std::to_string(s.prompt_tokens) + " tokens): no context to compress");
    queries_.assign(size_t(s.model->n_layers), torch::Tensor());
    K_ = s.model->n_kv_heads;
  }
  std::string score_name() const override { return "finch_vote"; }
  std::string score_meaning() const override {
    return "the question window's attention, each query's row times its position, mean over the "
           "window and the group";
  }
  Protection protection() const override { return {0, window_}; }

  // The last `window` prompt queries of each layer, across prefill chunks.
  void observe(LayerContext& c) override {
    if (!c.prefill) return;
    torch::Tensor& q = queries_[size_t(c.layer)];
    const torch::Tensor step = c.in.q.to(torch::kFloat32);  // [n, H, hd]
    q = q.defined() ? torch::cat({q, step}, 0) : step.clone();
    if (q.size(0) > window_) q = q.narrow(0, q.size(0) - window_, window_).contiguous();
    scale_ = c.in.scale;
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const torch::Tensor& q = queries_[size_t(c.layer)];
    const int64_t P = c.tokens_fed(), first_window = P - window_;
    if (!q.defined() || q.size(0) < window_ || first_window < 1)
      throw InputError("--policy", "finch:window",
                       "needs a prompt longer than the window (" + std::to_string(window_) +
                           " tokens), got " + std::to_string(P));
    const HeldRows r = held_rows(c.cache, c.layer, kv_head);
    const int64_t group = q.size(1) / K_;
    const torch::Tensor qg = q.narrow(1, kv_head * group, group).transpose(0, 1);  // [R, W, hd]
    torch::Tensor logits = qg.matmul(r.keys.t()) * scale_;                         // [R, W, m]
    const torch::Tensor key_pos = torch::tensor(r.pos).to(torch::kInt64);
    const torch::Tensor query_pos = torch::arange(first_window, P, torch::kInt64);
    logits.masked_fill_(key_pos.unsqueeze(0) > query_pos.unsqueeze(1), -INFINITY);
    torch::Tensor probs = torch::softmax(logits, -1);
    if (normalize_) probs = probs * query_pos.to(torch::kFloat32).unsqueeze(1);
    const torch::Tensor s = probs.mean(1).mean(0).contiguous();  // [m]
    const float* v = s.data_ptr<float>();
    for (int64_t j = 0; j < r.size(); ++j)
      out[r.pos[size_t(j)]] = r.pos[size_t(j)] < first_window ? v[j] : 0.0f;  // window: protected
  }

 private:
  int64_t window_;
  bool normalize_;
  int64_t K_ = 0;
  double scale_ = 1.0;
  std::vector<torch::Tensor> queries_;  // per layer: [<= window, H, hd]
};

}  // namespace

PolicyDescriptor finch_descriptor() {
  return {"finch",
          "prompt-guided: the question's queries (the prompt's last `window` tokens) vote for the "
          "context's keys, rows scaled by position; kept keys re-rotated; prefill only",
          "Corallo & Papotti, FINCH: Prompt-guided Key-Value Cache Compression for Large Language "
          "Models, TACL 2024 (kvpress FinchPress)",
          "docs/policies/finch.md",
          {{"budget", ParamType::Int, "256", "entries kept per head, the question window included"},
           {"window", ParamType::Int, "32",
            "the question: the prompt's last `window` tokens, whose queries vote (always kept)", 1},
           {"normalize", ParamType::Bool, "true",
            "scale each window query's attention row by its position (kvpress normalize_scores)"},
           {"rerotate", ParamType::Bool, "true",
            "re-rotate the kept keys to RoPE positions 0..n-1 (docs/policies/rerotate.md)"}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < p.get_int("window"))
              throw InputError("--policy", "finch:budget",
                               "must be >= window (" + std::to_string(p.get_int("window")) +
                                   "): the question is always kept");
            auto policy = std::make_unique<ScoredPolicy>(
                std::make_unique<FinchScorer>(p.get_int("window"), p.get_bool("normalize")),
                std::vector<int64_t>{p.get_int("budget")}, false, "lowest question vote");
            policy->shape().rerotate = p.get_bool("rerotate");
            return policy;
          }};
}

}  // namespace kvscope::policy
