// random: the baseline every compression paper needs (kvpress RandomPress).
// Each entry gets a uniform random score in [0, 1) and each head keeps its
// `budget` highest. At the end of the prefill the scores of the prompt are
// kvpress's exactly: torch.rand([1, K, T]) from a CPU generator seeded with
// `seed`, drawn afresh for every layer (so every layer draws the same
// numbers, as kvpress's seeded press does). A token written at decode gets
// rand([K]) from a generator seeded with seed + 1000003 (1 + pos): a fixed
// score per entry, so a kept entry is not re-drawn at every step.
// docs/policies/random.md
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class RandomScorer : public HeadScorer {
 public:
  explicit RandomScorer(uint64_t seed) : seed_(seed) {}

  void setup(const PolicySetup& s) override {
    K_ = s.model->n_kv_heads;
    scores_.resize(s.model->n_layers, K_, s.max_tokens);
    drawn_.assign(size_t(s.model->n_layers), 0);
  }
  std::string score_name() const override { return "random_score"; }
  std::string score_meaning() const override {
    return "uniform random number in [0, 1) per entry (seeded; higher = kept)";
  }

  void observe(LayerContext& c) override {
    int64_t& drawn = drawn_[size_t(c.layer)];
    if (c.prompt_complete && drawn == 0) {
      // The prompt, at once: kvpress draws [1, K, T] when the prefill ends.
      draw(c.layer, 0, c.tokens_fed(), seed_);
      drawn = c.tokens_fed();
    }
    for (int64_t pos = std::max(drawn, c.pos0); drawn > 0 && pos < c.tokens_fed(); ++pos)
      draw(c.layer, pos, 1, seed_ + 1000003ull * uint64_t(1 + pos));
    if (drawn > 0) drawn = std::max(drawn, c.tokens_fed());
  }
  Subsets subsets() const override { return Subsets::Entry; }
  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const float* s = scores_.at(c.layer, kv_head);
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0)) out[pos] = s[pos];
  }

 private:
  // Scores of positions [pos0, pos0 + n) of every kv head of `layer`.
  void draw(int64_t layer, int64_t pos0, int64_t n, uint64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    torch::Tensor r = torch::rand({1, K_, n}, gen, torch::kFloat32).contiguous();
    const float* p = r.data_ptr<float>();
    for (int64_t h = 0; h < K_; ++h)
      for (int64_t i = 0; i < n; ++i) scores_.at(layer, h)[pos0 + i] = p[h * n + i];
  }

  uint64_t seed_;
  int64_t K_ = 0;
  HeadScores scores_;
  std::vector<int64_t> drawn_;  // per layer: positions scored so far (0: the prompt not yet)
};

std::vector<ParamSpec> random_params() {
  return {{"seed", ParamType::Int, "0", "seed of the random scores", 0, double(int64_t(1) << 30)}};
}

std::unique_ptr<HeadScorer> make_random(const Params& p) {
  return std::make_unique<RandomScorer>(uint64_t(p.get_int("seed")));
}

}  // namespace

ScorerDescriptor random_scorer() {
  return {"random", random_params(), make_random};
}

PolicyDescriptor random_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  for (const ParamSpec& s : random_params()) params.push_back(s);
  return {"random",
          "keep a random `budget` entries per head (seeded): the baseline",
          "kvpress RandomPress (NVIDIA kvpress 0.5.5); the baseline of every KV-compression paper",
          "docs/policies/random.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "random:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_random(p),
                                                  std::vector<int64_t>{p.get_int("budget")},
                                                  p.get_bool("decode"), "lowest random score");
          }};
}

}  // namespace kvscope::policy
