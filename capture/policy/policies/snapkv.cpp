// snapkv: SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for
// Before Generation", NeurIPS 2024). At the end of the prefill, the last
// `window` prompt queries (the observation window) vote for the earlier keys:
//   C[j] = sum over window queries i of softmax(q_i K^T * scale)[j]
// (mean over the group's query heads under GQA), smoothed by a 1-D pooling of
// width `kernel` over the prefix (clustering), and each head keeps the window
// plus the top (budget - window) prefix keys. The paper compresses once; at
// decode KVScope repeats the vote at every step with the last `window`
// generated queries (decode=false: the paper's grow-only decode).
// docs/policies/snapkv.md
#include <algorithm>
#include <deque>
#include <utility>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class SnapKvScorer : public HeadScorer {
 public:
  SnapKvScorer(int64_t window, int64_t kernel, bool max_pool)
      : window_(window), kernel_(kernel), max_pool_(max_pool) {}

  void setup(const PolicySetup& s) override {
    sums_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
    rings_.assign(size_t(s.model->n_layers * s.model->n_kv_heads), {});
    K_ = s.model->n_kv_heads;
  }
  cache::StatsNeeds stats_needs() const override { return {true, false, window_}; }
  std::string score_name() const override { return "snapkv_vote"; }
  std::string score_meaning() const override {
    return "observation-window attention, mean over the window's queries, pooled over neighbours";
  }
  Protection protection() const override { return {0, window_}; }

  // Decode: the observation window slides over the generated tokens. Each
  // step's attention row (one query, mean over the group) enters a ring of
  // `window` rows whose running sum is the vote.
  void observe(LayerContext& c) override {
    if (c.prefill) return;
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      float* sum = sums_.at(c.layer, h);
      std::deque<Row>& ring = rings_[size_t(c.layer * K_ + h)];
      Row row;
      const std::vector<float>& received = c.stats.received[size_t(h)];
      for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
        const float w = received[size_t(pos)] * float(c.n);  // n = 1 at decode
        row.emplace_back(pos, w);
        sum[pos] += w;
      }
      ring.push_back(std::move(row));
      if (int64_t(ring.size()) > window_) {
        for (auto [pos, w] : ring.front()) sum[pos] -= w;
        ring.pop_front();
      }
    }
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const int64_t first_window_pos = c.tokens_fed() - window_;
    std::vector<int64_t> prefix;  // held keys before the window, in position order
    for (int32_t pos : c.cache.positions(c.layer, kv_head, 0))
      if (pos < first_window_pos)
        prefix.push_back(pos);
      else
        out[pos] = 0.0f;  // protected anyway
    std::sort(prefix.begin(), prefix.end());
    const float* votes =
        c.prefill ? c.stats.window[size_t(kv_head)].data() : sums_.at(c.layer, kv_head);
    // The mean over the window's queries (kvpress's scale; the paper sums:
    // the same ranking, but CriticalKV adds an epsilon on this scale).
    const size_t rows = rings_[size_t(c.layer * K_ + kv_head)].size();
    const float queries = float(std::max<int64_t>(1, c.prefill ? c.stats.window_queries : int64_t(rows)));
    const int64_t n = int64_t(prefix.size()), half = kernel_ / 2;
    for (int64_t i = 0; i < n; ++i) {
      // F.avg_pool1d(kernel, stride 1, padding kernel/2): zero padding counted
      // in the mean; max pooling ignores the padding.
      float acc = max_pool_ ? -1.0f : 0.0f;
      for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(n - 1, i + half); ++j) {
        const float v = votes[prefix[size_t(j)]];
        acc = max_pool_ ? std::max(acc, v) : acc + v;
      }
      out[prefix[size_t(i)]] = (max_pool_ ? acc : acc / float(kernel_)) / queries;
    }
  }

 private:
  using Row = std::vector<std::pair<int32_t, float>>;
  int64_t window_, kernel_;
  bool max_pool_;
  int64_t K_ = 0;
  HeadScores sums_;
  std::vector<std::deque<Row>> rings_;
};

std::vector<ParamSpec> snapkv_params() {
  return {{"window", ParamType::Int, "32",
           "observation window: the last prompt queries that vote (always kept)"},
          {"kernel", ParamType::Int, "5", "pooling kernel width over neighbouring keys (odd)"},
          {"pooling", ParamType::String, "avg", "avg or max"}};
}

std::unique_ptr<HeadScorer> make_snapkv(const Params& p) {
  const std::string& pooling = p.get_string("pooling");
  if (p.get_int("window") < 1) throw InputError("--policy", "window", "must be >= 1");
  if (p.get_int("kernel") < 1 || p.get_int("kernel") % 2 == 0)
    throw InputError("--policy", "kernel", "an odd number >= 1 expected");
  if (pooling != "avg" && pooling != "max")
    throw InputError("--policy", "pooling", "'avg' or 'max' expected, got '" + pooling + "'");
  return std::make_unique<SnapKvScorer>(p.get_int("window"), p.get_int("kernel"), pooling == "max");
}

}  // namespace

ScorerDescriptor snapkv_scorer() {
  return {"snapkv", snapkv_params(), make_snapkv};
}

PolicyDescriptor snapkv_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head, observation window included"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step with the last `window` generated queries (false: the "
       "paper, prefill only)"}};
  for (const ParamSpec& s : snapkv_params()) params.push_back(s);
  return {
      "snapkv",
      "observation-window votes, pooled, top-k per head at the end of the prefill (and at decode)",
      "Li et al., SnapKV: LLM Knows What You are Looking for Before Generation, NeurIPS 2024",
      "docs/policies/snapkv.md",
      params,
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_int("budget") < p.get_int("window"))
          throw InputError("--policy", "snapkv:budget",
                           "must be >= window (the window is always kept)");
        return std::make_unique<ScoredPolicy>(make_snapkv(p),
                                              std::vector<int64_t>{p.get_int("budget")},
                                              p.get_bool("decode"), "lowest pooled window vote");
      }};
}

}  // namespace kvscope::policy
