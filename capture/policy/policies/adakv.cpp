// adakv: Ada-KV's adaptive head budgets (Feng et al., "Ada-KV: Optimizing KV
// Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference",
// 2024) around ANY per-head scorer. The layer's budget, `budget` entries per
// head times the kv heads, is shared: the layer keeps its highest-scored
// entries wherever they are, so a head whose scores are concentrated gives
// entries to a head whose scores are spread. A safeguard (the official code's
// floor_alpha, kvpress's alpha_safeguard) first guarantees every head its own
// top floor(alpha * budget) entries. `adakv:scorer=snapkv,window=16,...`
// passes the other parameters to the scorer. docs/policies/adakv.md
#include <algorithm>
#include <cmath>
#include <set>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class AdaKvPolicy : public ScoredPolicy {
 public:
  AdaKvPolicy(std::unique_ptr<HeadScorer> scorer, int64_t budget, double alpha, bool decode)
      : ScoredPolicy(std::move(scorer), {budget}, decode, "lowest score in the layer"),
        alpha_(alpha) {}

  std::string budget_kind() const override { return decode_ ? "layer" : "none"; }
  // Entries a layer may hold (all its kv heads together).
  int64_t budget() const override {
    return setup_.model ? budgets_[0] * setup_.model->n_kv_heads : budgets_[0];
  }

  void after_attention(LayerContext& c) override {
    scorer_->observe(c);
    if (!compressing(c)) return;
    const int64_t K = c.cache.n_kv_heads(), per_head = budgets_[0];
    int64_t held = 0;
    for (int64_t h = 0; h < K; ++h) held += c.cache.count(c.layer, h, 0);
    if (held <= per_head * K) return;

    int64_t safe = int64_t(std::floor(alpha_ * double(per_head)));
    if (alpha_ > 0) safe = std::max<int64_t>(safe, 1);
    const Protection protect = scorer_->protection();
    struct Entry {
      float score;
      int64_t head, pos;
    };
    auto better = [](const Entry& a, const Entry& b) {  // kept first; ties keep the newer
      if (a.score != b.score) return a.score > b.score;
      if (a.pos != b.pos) return a.pos > b.pos;
      return a.head < b.head;
    };
    std::vector<Entry> pool;
    int64_t guaranteed = 0;
    for (int64_t h = 0; h < K; ++h) {
      float* s = scores_.at(c.layer, h);
      score_head(c, h, s);
      std::vector<Entry> mine;
      int64_t protected_count = 0;
      for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
        if (protect.protects(pos, c.tokens_fed()))
          ++protected_count;
        else
          mine.push_back({s[pos], h, pos});
      }
      std::sort(mine.begin(), mine.end(), better);
      // The safeguard counts the protected entries first (they outrank all).
      const int64_t own =
          std::min<int64_t>(int64_t(mine.size()), std::max<int64_t>(0, safe - protected_count));
      guaranteed += protected_count + own;
      pool.insert(pool.end(), mine.begin() + own, mine.end());
    }
    const int64_t room = std::max<int64_t>(0, per_head * K - guaranteed);
    std::sort(pool.begin(), pool.end(), better);
    std::vector<std::vector<int64_t>> leave(static_cast<size_t>(K));
    for (size_t i = size_t(std::min<int64_t>(room, int64_t(pool.size()))); i < pool.size(); ++i)
      leave[size_t(pool[i].head)].push_back(pool[i].pos);
    for (int64_t h = 0; h < K; ++h) {
      std::sort(leave[size_t(h)].begin(), leave[size_t(h)].end());
      evict_all(c.decide, c.layer, h, leave[size_t(h)], scores_.at(c.layer, h), 1);
    }
  }

 private:
  double alpha_;
};

// Every scorer parameter, once, as a string the chosen scorer parses.
std::vector<ParamSpec> forwarded_params() {
  std::vector<ParamSpec> out;
  std::set<std::string> seen;
  for (const ScorerDescriptor& d : builtin_scorers())
    for (const ParamSpec& s : d.params)
      if (seen.insert(s.name).second)
        out.push_back({s.name, ParamType::String, "",
                       "passed to the scorer (" + d.name + ": " + s.help + ")"});
  return out;
}

}  // namespace

const std::vector<ScorerDescriptor>& builtin_scorers() {
  static const std::vector<ScorerDescriptor> all = {snapkv_scorer(), tova_scorer(), knorm_scorer(),
                                                    expected_attention_scorer()};
  return all;
}

PolicyDescriptor adakv_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "snapkv",
       "per-head scorer: snapkv, tova, knorm or expected_attention"},
      {"budget", ParamType::Int, "256", "mean entries per head; the layer holds budget x kv heads"},
      {"alpha", ParamType::Float, "0.2",
       "safeguard: every head keeps its top floor(alpha x budget) entries", 0, 1},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only)"}};
  for (const ParamSpec& s : forwarded_params()) params.push_back(s);
  return {
      "adakv",
      "adaptive head budgets: a per-layer budget shared across heads, around any per-head scorer",
      "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for "
      "Efficient LLM "
      "Inference, 2024",
      "docs/policies/adakv.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        const std::string& name = p.get_string("scorer");
        const ScorerDescriptor* d = find_scorer(name);
        if (!d) {
          std::string known;
          for (const ScorerDescriptor& s : builtin_scorers())
            known += (known.empty() ? "" : ", ") + s.name;
          throw InputError("--policy", "adakv:scorer",
                           "unknown scorer '" + name + "' (known: " + known + ")");
        }
        std::map<std::string, std::string> given;
        for (const ParamSpec& s : forwarded_params()) {
          if (!p.was_given(s.name)) continue;
          bool takes = false;
          for (const ParamSpec& own : d->params) takes |= own.name == s.name;
          if (!takes)
            throw InputError("--policy", "adakv:" + s.name, "not a parameter of scorer " + name);
          given[s.name] = p.get_string(s.name);
        }
        std::unique_ptr<HeadScorer> scorer = d->make(Params(name, d->params, given));
        const Protection pr = scorer->protection();
        if (p.get_int("budget") < pr.sinks + pr.recent + 1)
          throw InputError("--policy", "adakv:budget",
                           "must exceed the scorer's protected entries (" +
                               std::to_string(pr.sinks + pr.recent) + ")");
        if (p.get_float("alpha") < 0 || p.get_float("alpha") > 1)
          throw InputError("--policy", "adakv:alpha", "a number in [0, 1] expected");
        return std::make_unique<AdaKvPolicy>(std::move(scorer), p.get_int("budget"),
                                             p.get_float("alpha"), p.get_bool("decode"));
      }};
}

}  // namespace kvscope::policy
