// compactor: Compactor (Chari & Van Durme, "Compactor: Calibrated
// Query-Agnostic KV Cache Compression with Approximate Leverage Scores",
// 2025), as kvpress's CompactorPress computes it. The first `sinks` and the
// last `recent` prompt entries stay; on the middle of the prompt,
//   score = blending * z(leverage of pre-RoPE keys) + z(non-causal attention)
// (leverage.cpp, non_causal_attention.cpp, each computed on the middle only
// and z-scored over the layer), and the kept ends get the layer's largest
// score. `blending` defaults to the compression ratio 1 - budget / prompt
// (kvpress's default; the paper calibrates it). Prefill only: it needs every
// prompt query. docs/policies/compactor.md
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/compactor_scores.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct CompactorOptions {
  int64_t budget = 256, sinks = 8, recent = 4, chunk = 256, sketch = 48;
  double blending = std::nan("");  // unset: the compression ratio
  uint64_t seed = 0;
};

class CompactorScorer : public HeadScorer {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  explicit CompactorScorer(CompactorOptions o)
      : o_(o), gen_(at::detail::createCPUGenerator(o.seed)) {}
  void setup(const PolicySetup& s) override {
    queries_.assign(size_t(s.model->n_layers), {});
    K_ = s.model->n_kv_heads;
    inverse_ = std::make_unique<RopeInverse>(*s.model);
    blending_ = std::isnan(o_.blending)
                    ? 1.0 - double(o_.budget) / double(std::max<int64_t>(1, s.prompt_tokens))
                    : o_.blending;
  }
  std::string score_name() const override { return "compactor"; }
  std::string score_meaning() const override {
    return "blending x z(key leverage) + z(non-causal attention) on the prompt's middle; the ends "
           "the layer's largest score";
  }
  void observe(LayerContext& c) override {
    if (c.prefill) queries_[size_t(c.layer)].push_back(c.in.q.to(torch::kFloat32).transpose(0, 1));
  }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    if (c.layer != layer_) score_layer(c);
    const float* p = scores_[kv_head].data_ptr<float>();
    for (size_t j = 0; j < pos_.size(); ++j) out[pos_[j]] = p[j];
  }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"blending", blending_}};
  }

 private:
  void score_layer(LayerContext& c) {
    layer_ = c.layer;
    std::vector<torch::Tensor> keys, values;
    for (int64_t h = 0; h < K_; ++h) {
      HeldRows r = held_rows(c.cache, c.layer, h);
      KVSCOPE_CHECK(h == 0 || r.pos == pos_, "compactor: heads hold different prompt positions");
      keys.push_back(r.keys), values.push_back(r.values), pos_ = std::move(r.pos);
    }
    torch::Tensor q = torch::cat(queries_[size_t(c.layer)], 1);  // [H, S, d]
    queries_[size_t(c.layer)].clear();
    const int64_t S = int64_t(pos_.size());
    const int64_t left = std::min(o_.sinks, S),
                  right = std::min(o_.recent, std::max<int64_t>(0, S - left));
    const int64_t mid = S - left - right;
    torch::Tensor k = torch::stack(keys).narrow(1, left, mid),
                  v = torch::stack(values).narrow(1, left, mid);
    std::vector<int32_t> mid_pos(pos_.begin() + left, pos_.begin() + left + mid);
    std::vector<torch::Tensor> pre;
    for (int64_t h = 0; h < K_; ++h) pre.push_back((*inverse_)(k[h], mid_pos, c.tokens_fed()));
    torch::Tensor lev = z_score(leverage_scores(torch::stack(pre), o_.sketch, gen_));
    torch::Tensor att = z_score(non_causal_scores(q.narrow(1, left, mid), k, v, o_.chunk));
    torch::Tensor s = blending_ * lev + att;  // [K, mid]
    const double top = s.max().item<double>();
    scores_ = torch::constant_pad_nd(s, {left, right}, top).contiguous();
  }

  CompactorOptions o_;
  at::Generator gen_;
  std::unique_ptr<RopeInverse> inverse_;
  double blending_ = 0;
  int64_t K_ = 0, layer_ = -1;
  std::vector<std::vector<torch::Tensor>> queries_;
  std::vector<int32_t> pos_;
  torch::Tensor scores_;
};

}  // namespace

PolicyDescriptor compactor_descriptor() {
  return {
      "compactor",
      "Compactor: blend of key leverage and non-causal chunked attention; prefill only",
      "Chari & Van Durme, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
      "Approximate Leverage Scores, 2025 (kvpress CompactorPress)",
      "docs/policies/compactor.md",
      {{"budget", ParamType::Int, "256", "entries kept per head"},
       {"sinks", ParamType::Int, "8", "first prompt entries always kept"},
       {"recent", ParamType::Int, "4", "last prompt entries always kept"},
       {"chunk", ParamType::Int, "256", "chunk of the non-causal attention", 1},
       {"sketch", ParamType::Int, "48", "columns of the leverage sketch", 1},
       {"blending", ParamType::Float, "",
        "weight of the leverage score (unset: the compression ratio 1 - budget / prompt)", 0, 1e6},
       {"seed", ParamType::Int, "0", "seed of the sketch's generator", 0}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        CompactorOptions o;
        o.budget = p.get_int("budget"), o.sinks = p.get_int("sinks");
        o.recent = p.get_int("recent"), o.chunk = p.get_int("chunk");
        o.sketch = p.get_int("sketch"), o.blending = p.get_float("blending");
        o.seed = uint64_t(p.get_int("seed"));
        if (o.budget < 1) throw InputError("--policy", "compactor:budget", "must be >= 1");
        if (o.sinks < 0 || o.recent < 0)
          throw InputError("--policy", "compactor:sinks/recent", "must be >= 0");
        return std::make_unique<ScoredPolicy>(std::make_unique<CompactorScorer>(o),
                                              std::vector<int64_t>{o.budget}, false,
                                              "lowest Compactor score");
      }};
}

}  // namespace kvscope::policy
