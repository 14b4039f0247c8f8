// cam: Cache Merging (Zhang et al., "CaM: Cache Merging for Memory-efficient
// LLMs Inference", ICML 2024), as kvpress's CAMPress runs it at decode. Each
// layer accumulates, from the first decode step on, the attention every held
// key receives (A_i, summed over decode queries, the group's query heads
// averaged). Every `every` decode steps, when a head holds more than `budget`
// entries, the layer keeps the `budget` entries of highest score (the score
// averaged over the layer's kv heads: one kept set per layer) and evicts the
// rest. Before they leave, the k highest-scored of the evicted (k = decode
// steps since the last compression) are merge candidates: candidate m's
// window is the `merge_budget` kept entries that follow it in position order,
// and per kv head it merges with probability
//   p = clamp(A_m / mean_{t in window} A_t, 0, 1)   (Bernoulli, seeded)
// adding v_m / |window| to the value of every entry of its window (keys stay).
// Each merge is recorded in the trace's /merges (weight 1 / |window|).
// docs/policies/cam.md
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

constexpr uint16_t kReasonEvicted = 1;

class CamPolicy : public Policy {
 public:
  // scorer null: CaM's own score, the accumulated attention A.
  CamPolicy(std::unique_ptr<HeadScorer> scorer, int64_t budget, int64_t every, int64_t merge_budget,
            uint64_t seed)
      : scorer_(std::move(scorer)),
        budget_(budget),
        every_(every),
        merge_budget_(merge_budget),
        seed_(seed) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    if (scorer_) scorer_->setup(s);
    L_ = s.model->n_layers;
    K_ = s.model->n_kv_heads;
    acc_.resize(L_, K_, s.max_tokens);
    scores_.resize(L_, K_, s.max_tokens, std::numeric_limits<float>::quiet_NaN());
    steps_.assign(size_t(L_), 0);
    by_pos_.assign(size_t(s.max_tokens), 0.0f);
    // torch.manual_seed(seed) seeds the same mt19937: kvpress's Bernoulli
    // draws are reproduced when nothing else draws from its generator.
    generator_ = at::detail::createCPUGenerator(seed_);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "lowest score averaged over the layer's heads (value merged or dropped)"};
  }
  std::vector<trace::GateSpec> gates() const override {
    const double none = std::numeric_limits<double>::quiet_NaN();
    std::vector<trace::GateSpec> g = {{"cumulative_attention",
                                       "attention received since the first decode step, summed "
                                       "over decode queries (CaM's A_i)",
                                       "probability mass", none, true}};
    if (scorer_)
      g.push_back({scorer_->score_name(), scorer_->score_meaning() + " (eviction score)", "score",
                   none, true});
    return g;
  }
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n = scorer_ ? scorer_->stats_needs() : cache::StatsNeeds{};
    n.last_query = true;
    return n;
  }
  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return budget_; }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return scorer_ ? scorer_->resolved_params() : std::vector<std::pair<std::string, double>>{};
  }

  void after_attention(LayerContext& c) override {
    if (scorer_) scorer_->observe(c);
    if (c.reconstruction >= 0) return;
    if (c.prefill) {  // kvpress drops the running sum when a prefill starts
      steps_[size_t(c.layer)] = 0;
      return;
    }
    accumulate(c);
    int64_t& steps = steps_[size_t(c.layer)];
    ++steps;
    if (steps >= every_ && most_held(c) > budget_) {
      compress(c, steps);
      steps = 0;
    }
  }

 private:
  void accumulate(LayerContext& c) {
    for (int64_t h = 0; h < K_; ++h) {
      float* a = acc_.at(c.layer, h);
      const std::vector<float>& w = c.stats.last_query[size_t(h)];
      for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
        a[pos] += w[size_t(pos)];
        c.decide.gate(0, c.layer, h, pos, a[pos], c.step % 16 == 0);
      }
    }
  }

  // The most entries one head of the layer holds (checked every decode step:
  // cheaper than the union, which only a compression needs).
  int64_t most_held(const LayerContext& c) const {
    size_t most = 0;
    for (int64_t h = 0; h < K_; ++h) most = std::max(most, c.cache.positions(c.layer, h, 0).size());
    return int64_t(most);
  }

  // Every position some head of the layer holds, ascending.
  std::vector<int64_t> held_union(const LayerContext& c) const {
    std::vector<int64_t> all;
    for (int64_t h = 0; h < K_; ++h)
      for (int32_t pos : c.cache.positions(c.layer, h, 0)) all.push_back(pos);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  // The score of each held position averaged over the heads that hold it.
  std::vector<double> mean_scores(LayerContext& c, const std::vector<int64_t>& held) {
    std::vector<double> sum(held.size(), 0.0);
    std::vector<int64_t> n(held.size(), 0);
    for (int64_t h = 0; h < K_; ++h) {
      float* s = scorer_ ? scores_.at(c.layer, h) : acc_.at(c.layer, h);
      if (scorer_) {
        scorer_->score(c, h, s);
        for (int32_t pos : c.cache.positions(c.layer, h, 0))
          c.decide.gate(1, c.layer, h, pos, s[pos], true);
      }
      for (size_t i = 0; i < held.size(); ++i)
        if (c.cache.holds(c.layer, h, held[i])) sum[i] += s[held[i]], ++n[i];
    }
    for (size_t i = 0; i < held.size(); ++i) sum[i] /= double(std::max<int64_t>(1, n[i]));
    return sum;
  }

  void compress(LayerContext& c, int64_t steps) {
    const std::vector<int64_t> held = held_union(c);
    const std::vector<double> score = mean_scores(c, held);
    // Rank: lowest score first (ties: the earlier position leaves first).
    std::vector<size_t> order(held.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return score[a] < score[b]; });
    const size_t n_evict = held.size() - size_t(budget_);
    std::vector<size_t> evict(order.begin(), order.begin() + long(n_evict));
    std::vector<int64_t> kept;
    for (size_t i = n_evict; i < order.size(); ++i) kept.push_back(held[order[i]]);
    std::sort(kept.begin(), kept.end());
    // Merge candidates: the `steps` highest-scored of the evicted (ties: the
    // later position first, as kvpress's flipped stable sort), by position.
    std::vector<size_t> cand = evict;
    std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) {
      return score[a] > score[b] || (score[a] == score[b] && held[a] > held[b]);
    });
    cand.resize(std::min(cand.size(), size_t(steps)));
    std::vector<int64_t> merging;
    for (size_t i : cand) merging.push_back(held[i]);
    std::sort(merging.begin(), merging.end());
    merge(c, merging, kept);
    std::vector<int64_t> leaving;
    for (size_t i : evict) leaving.push_back(held[i]);
    std::sort(leaving.begin(), leaving.end());
    // The evictions' scores by position (only held positions are read).
    for (size_t i = 0; i < held.size(); ++i) by_pos_[size_t(held[i])] = float(score[i]);
    for (int64_t h = 0; h < K_; ++h) {
      std::vector<int64_t> out;
      for (int64_t pos : leaving)
        if (c.cache.holds(c.layer, h, pos)) out.push_back(pos);
      evict_all(c.decide, c.layer, h, out, by_pos_.data(), kReasonEvicted);
    }
  }

  // Candidate m's window: the merge_budget kept positions after it.
  std::vector<int64_t> window_of(int64_t m, const std::vector<int64_t>& kept) const {
    auto it = std::upper_bound(kept.begin(), kept.end(), m);
    std::vector<int64_t> w;
    for (; it != kept.end() && int64_t(w.size()) < merge_budget_; ++it) w.push_back(*it);
    return w;
  }

  void merge(LayerContext& c, const std::vector<int64_t>& merging,
             const std::vector<int64_t>& kept) {
    if (merging.empty()) return;
    const int64_t M = int64_t(merging.size());
    std::vector<std::vector<int64_t>> windows;
    for (int64_t m : merging) windows.push_back(window_of(m, kept));
    // Merge probabilities [1, K, M] (kvpress's layout, so that the draws
    // follow the same order), then one Bernoulli draw per (head, candidate).
    torch::Tensor prob = torch::zeros({1, K_, M});
    for (int64_t h = 0; h < K_; ++h) {
      const float* a = acc_.at(c.layer, h);
      for (int64_t j = 0; j < M; ++j) {
        const std::vector<int64_t>& w = windows[size_t(j)];
        double mean = 0;
        for (int64_t t : w) mean += a[t];
        mean /= double(std::max<size_t>(1, w.size()));
        double p = double(a[merging[size_t(j)]]) / mean;
        if (std::isnan(p)) p = 0;
        if (std::isinf(p)) p = 1;
        prob[0][h][j] = float(std::clamp(p, 0.0, 1.0));
      }
    }
    const torch::Tensor draw = torch::bernoulli(prob, generator_).contiguous();
    const float* drawn = draw.data_ptr<float>();
    for (int64_t h = 0; h < K_; ++h) merge_head(c, h, merging, windows, drawn + h * M);
  }

  void merge_head(LayerContext& c, int64_t h, const std::vector<int64_t>& merging,
                  const std::vector<std::vector<int64_t>>& windows, const float* drawn) {
    const HeldRows rows = held_rows(c.cache, c.layer, h);
    std::map<int64_t, int64_t> row_of;
    for (size_t i = 0; i < rows.pos.size(); ++i) row_of[rows.pos[i]] = int64_t(i);
    torch::Tensor values = rows.values.clone();
    std::vector<std::tuple<int64_t, int64_t, float>> pairs;  // (m, t, weight)
    for (size_t j = 0; j < merging.size(); ++j) {
      const auto m = row_of.find(merging[j]);
      const std::vector<int64_t>& w = windows[j];
      if (drawn[j] == 0 || w.empty() || m == row_of.end()) continue;
      const float weight = 1.0f / float(w.size());
      for (int64_t t : w) {
        const auto at = row_of.find(t);
        if (at == row_of.end()) continue;
        values[at->second] += rows.values[m->second] * weight;
        pairs.emplace_back(merging[j], t, weight);
      }
    }
    values = values.contiguous();
    const int64_t hd = values.size(1);
    for (const auto& [m, t, weight] : pairs)
      c.decide.merge(c.layer, h, m, t, weight, values.data_ptr<float>() + row_of[t] * hd);
  }

  std::unique_ptr<HeadScorer> scorer_;
  int64_t budget_, every_, merge_budget_;
  uint64_t seed_;
  int64_t L_ = 0, K_ = 0;
  HeadScores acc_, scores_;
  std::vector<int64_t> steps_;  // per layer: decode steps since the last compression
  std::vector<float> by_pos_;   // compress(): the layer's mean scores by position (scratch)
  at::Generator generator_;
};

}  // namespace

PolicyDescriptor cam_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "cumulative",
       "eviction score: cumulative (CaM's accumulated attention) or a scorer (kvpress's "
       "base_press): " +
           scorer_names()},
      {"budget", ParamType::Int, "256", "entries each head keeps after a compression", 1},
      {"every", ParamType::Int, "1",
       "decode steps between compressions (1: the paper's per-step CaM; kvpress "
       "compression_interval, default 512)",
       1},
      {"merge_budget", ParamType::Int, "32",
       "kept entries after an evicted one that share its value (kvpress merge_budget)", 1},
      {"merge_seed", ParamType::Int, "0", "seed of the Bernoulli merge draws (torch.manual_seed)",
       0}};
  params = with_scorer_params(std::move(params));
  return {"cam",
          "Cache Merging at decode: evicted values merge into the kept entries after them, each "
          "with probability min(1, A_i / window mean A)",
          "Zhang et al., CaM: Cache Merging for Memory-efficient LLMs Inference, ICML 2024 "
          "(kvpress CAMPress)",
          "docs/policies/cam.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            std::unique_ptr<HeadScorer> scorer;
            if (p.get_string("scorer") == "cumulative") {
              for (const ParamSpec& s : scorer_forwarded_params())
                if (p.was_given(s.name))
                  throw InputError("--policy", "cam:" + s.name,
                                   "not a parameter of scorer cumulative (CaM's own score)");
            } else {
              scorer = make_named_scorer("cam", p);
            }
            return std::make_unique<CamPolicy>(std::move(scorer), p.get_int("budget"),
                                               p.get_int("every"), p.get_int("merge_budget"),
                                               uint64_t(p.get_int("merge_seed")));
          }};
}

}  // namespace kvscope::policy
