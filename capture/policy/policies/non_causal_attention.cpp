// non_causal_attention: non-causal chunked attention, summed over queries
// (Chari & Van Durme, "Compactor", 2025; kvpress NonCausalAttnPress). The
// prompt is cut into chunks of `chunk` positions; within a chunk every query
// attends every key, causal or not, and a key's score is the attention it
// receives from its chunk's queries:
//   A(j) = sum_{i in chunk(j)} softmax_{k in chunk(j)}(q_i . k_k)[j]
// (no 1/sqrt(d), as kvpress), mean over the group's query heads, times
// ||v_j||, averaged over 3 neighbours (zero padding counted) and z-scored over
// the layer's heads. kvpress pads the last chunk to `chunk` positions with
// zero queries and keys whose logits are -1e-9, not -inf: padded keys take
// softmax mass and padded queries add a near-uniform row to every column.
// KVScope reproduces that (the cross-check compares kept sets). Prefill only:
// the queries of the whole prompt are buffered per layer until it is in.
// docs/policies/non_causal_attention.md
#include <torch/torch.h>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/compactor_scores.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

torch::Tensor non_causal_scores(const torch::Tensor& queries, const torch::Tensor& keys,
                                const torch::Tensor& values, int64_t chunk) {
  const int64_t H = queries.size(0), K = keys.size(0), S = keys.size(1), d = keys.size(2);
  const int64_t R = H / K, padded = (S + chunk - 1) / chunk * chunk, pad = padded - S;
  torch::Tensor k = keys.repeat_interleave(R, 0);  // [H, S, d]
  torch::Tensor q = queries;
  if (pad > 0) {
    q = torch::cat({q, torch::zeros({H, pad, d}, q.options())}, 1);
    k = torch::cat({k, torch::zeros({H, pad, d}, k.options())}, 1);
  }
  const int64_t n = padded / chunk;
  torch::Tensor dots = q.view({H, n, chunk, d}).matmul(k.view({H, n, chunk, d}).transpose(-2, -1));
  if (pad > 0) {
    torch::Tensor last = dots.select(1, n - 1);      // [H, chunk, chunk], a view
    last.narrow(1, chunk - pad, pad).fill_(0.0f);    // padded queries
    last.narrow(2, chunk - pad, pad).fill_(-1e-9f);  // padded keys
  }
  torch::Tensor a = torch::softmax(dots, -1).sum(-2).reshape({H, padded}).narrow(1, 0, S);
  a = a.view({K, R, S}).mean(1);                                    // [K, S]
  torch::Tensor s = a * values.norm(2, -1);                         // [K, S]
  s = torch::avg_pool1d(s.unsqueeze(0), {3}, {1}, {1}).squeeze(0);  // count_include_pad
  return s;
}

namespace {

class NonCausalScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  explicit NonCausalScorer(int64_t chunk) : chunk_(chunk) {}
  void setup(const PolicySetup& s) override {
    queries_.assign(size_t(s.model->n_layers), {});
    K_ = s.model->n_kv_heads;
  }
  std::string score_name() const override { return "non_causal_attention"; }
  std::string score_meaning() const override {
    return "non-causal chunked attention received x ||v||, pooled, z-scored over the layer";
  }
  void observe(LayerContext& c) override {
    if (c.prefill) queries_[size_t(c.layer)].push_back(c.in.q.to(torch::kFloat32).transpose(0, 1));
  }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    if (c.layer != layer_) score_layer(c);
    const float* p = z_[kv_head].data_ptr<float>();
    for (size_t j = 0; j < pos_.size(); ++j) out[pos_[j]] = p[j];
  }

 private:
  void score_layer(LayerContext& c) {
    layer_ = c.layer;
    std::vector<torch::Tensor> keys, values;
    for (int64_t h = 0; h < K_; ++h) {
      HeldRows r = held_rows(c.cache, c.layer, h);
      KVSCOPE_CHECK(h == 0 || r.pos == pos_,
                    "non_causal_attention: heads hold different prompt positions");
      keys.push_back(r.keys), values.push_back(r.values), pos_ = std::move(r.pos);
    }
    torch::Tensor q = torch::cat(queries_[size_t(c.layer)], 1);  // [H, S, d]
    queries_[size_t(c.layer)].clear();
    z_ = z_score(non_causal_scores(q, torch::stack(keys), torch::stack(values), chunk_))
             .contiguous();
  }

  int64_t chunk_, K_ = 0, layer_ = -1;
  std::vector<std::vector<torch::Tensor>> queries_;  // per layer: the prompt's [H, n, d] chunks
  std::vector<int32_t> pos_;
  torch::Tensor z_;
};

}  // namespace

PolicyDescriptor non_causal_attention_descriptor() {
  return {"non_causal_attention",
          "non-causal chunked attention received x ||v|| (the attention half of Compactor); "
          "prefill only",
          "Chari & Van Durme, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
          "Approximate Leverage Scores, 2025 (kvpress NonCausalAttnPress)",
          "docs/policies/non_causal_attention.md",
          {{"budget", ParamType::Int, "256", "entries kept per head"},
           {"chunk", ParamType::Int, "256", "chunk of positions that attend each other", 1}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "non_causal_attention:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(
                std::make_unique<NonCausalScorer>(p.get_int("chunk")),
                std::vector<int64_t>{p.get_int("budget")}, false, "lowest non-causal attention");
          }};
}

}  // namespace kvscope::policy
