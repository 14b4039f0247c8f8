// dms: delayed eviction by a threshold on a per-token score (Łańcucki et al.,
// "Inference-Time Hyper-Scaling with KV Cache Compression", 2025: Dynamic
// Memory Sparsification), as kvpress's DMSPress runs it around any scorer.
// Each token is scored once, when it is written, by the scorer applied to the
// step's new tokens alone; it stays while it is among the head's `window`
// newest tokens, and when it leaves that window it is evicted if its score is
// below `threshold`. The memory is the content's, not a budget: a token above
// the threshold is never evicted. The paper learns the decision (a
// repurposed query neuron, trained with the model); kvpress's and this
// implementation take any scorer's score instead. docs/policies/dms.md
#include <deque>
#include <limits>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class DmsPolicy : public Policy {
 public:
  DmsPolicy(std::unique_ptr<HeadScorer> scorer, double threshold, int64_t window, bool decode)
      : scorer_(std::move(scorer)), threshold_(threshold), window_(window), decode_(decode) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    scorer_->setup(s);
    K_ = s.model->n_kv_heads;
    scores_.resize(s.model->n_layers, K_, s.max_tokens, std::numeric_limits<float>::quiet_NaN());
    scratch_.resize(1, 1, s.max_tokens);
    pending_.assign(size_t(s.model->n_layers * K_), {});
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "score below the threshold when it left the window"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{scorer_->score_name(), scorer_->score_meaning() + ", scored once when written",
             "score", threshold_, true}};
  }
  cache::StatsNeeds stats_needs() const override { return scorer_->stats_needs(); }

  void after_attention(LayerContext& c) override {
    scorer_->observe(c);
    if (!c.prefill && !decode_) return;
    std::vector<int64_t> fresh;
    for (int64_t i = 0; i < c.n; ++i) fresh.push_back(c.pos0 + i);
    for (int64_t h = 0; h < K_; ++h) {
      float* s = scores_.at(c.layer, h);
      // The step's new tokens, scored on their own (kvpress scores keys[-q_len:]).
      if (scorer_->subsets() == HeadScorer::Subsets::Set) {
        scorer_->score_rows(c, h, subset_rows(held_rows(c.cache, c.layer, h), fresh), s);
      } else {  // an entry's own score: keep the one it had when written
        float* now = scratch_.at(0, 0);
        scorer_->score(c, h, now);
        for (int64_t pos : fresh) s[pos] = now[pos];
      }
      std::deque<int64_t>& q = pending_[size_t(c.layer * K_ + h)];
      for (int64_t pos : fresh) {
        q.push_back(pos);
        c.decide.gate(0, c.layer, h, pos, s[pos], true);
      }
      std::vector<int64_t> out;
      while (int64_t(q.size()) > window_) {
        const int64_t pos = q.front();
        q.pop_front();
        if (s[pos] < threshold_ && c.cache.holds(c.layer, h, pos)) out.push_back(pos);
      }
      evict_all(c.decide, c.layer, h, out, s, 1);
    }
  }

 private:
  std::unique_ptr<HeadScorer> scorer_;
  double threshold_;
  int64_t window_;
  bool decode_;
  int64_t K_ = 0;
  HeadScores scores_, scratch_;
  std::vector<std::deque<int64_t>> pending_;  // per (layer, kv head): tokens in the window
};

}  // namespace

PolicyDescriptor dms_descriptor() {
  std::vector<ParamSpec> params = {
      {"scorer", ParamType::String, "keydiff",
       "per-token scorer, applied to each step's new tokens: knorm, keydiff, random, "
       "observed_attention or kvzap"},
      {"threshold", ParamType::Float, "0",
       "a token leaving the window is evicted when its score is below this", -1e30, 1e30},
      {"sliding_window", ParamType::Int, "128",
       "newest tokens per head never evicted (kvpress: sliding_window_size)", 0},
      {"decode", ParamType::Bool, "true",
       "also evict at decode, as tokens leave the window (false: prefill only, kvpress's "
       "default)"}};
  params = with_scorer_params(std::move(params));
  return {"dms",
          "delayed eviction: a token leaving the recent window is evicted if its score (taken "
          "when written) is below a threshold",
          "Łańcucki et al., Inference-Time Hyper-Scaling with KV Cache Compression (DMS), 2025 "
          "(kvpress DMSPress)",
          "docs/policies/dms.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            auto scorer = make_named_scorer("dms", p);
            if (scorer->subsets() == HeadScorer::Subsets::Other)
              throw InputError("--policy", "dms:scorer",
                               "'" + p.get_string("scorer") +
                                   "' cannot score a step's new tokens on their own: knorm, "
                                   "keydiff, random, observed_attention or kvzap expected");
            return std::make_unique<DmsPolicy>(std::move(scorer), p.get_float("threshold"),
                                               p.get_int("sliding_window"), p.get_bool("decode"));
          }};
}

}  // namespace kvscope::policy
