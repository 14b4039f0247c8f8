// dbtrimkv: globally calibrated retention (seed 002, "Make Each Token Count",
// §4: weight-tied retention gates, one global KV budget). The retention
// scores of every cached entry of every layer and kv head are ranked
// together: once the whole cache holds L*K*(M + buffer) entries, the
// L*K*M best log(beta)*(t + 1 - position) survive wherever they are, so heads
// get unequal budgets (the official DynamicBudgetTrimKVCache.compress after
// the forward pass). With min > 0, every head first keeps its own `min`
// best and the remaining L*K*(M - min) are ranked globally (official
// min_tokens_per_head). Per-head budgets over time are the trace's
// /occupancy. docs/policies/dbtrimkv.md
#include <algorithm>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/retention_gates.h"

namespace kvscope::policy {

namespace {

struct Entry {
  double score;
  int32_t layer, head, pos;
};

// Best first; ties keep the newer token, then the lower layer and head.
bool better(const Entry& a, const Entry& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.pos != b.pos) return a.pos > b.pos;
  return a.layer != b.layer ? a.layer < b.layer : a.head < b.head;
}

class DbTrimKvPolicy : public RetentionGatePolicy {
 public:
  DbTrimKvPolicy(std::string path, int64_t budget, int64_t buffer, int64_t min_per_head,
                 int64_t lookahead, int64_t window)
      : RetentionGatePolicy("dbtrimkv", std::move(path), lookahead, window),
        M_(budget),
        buffer_(buffer),
        min_(min_per_head) {}

  std::string budget_kind() const override { return "global"; }
  int64_t budget() const override { return setup_.model ? heads() * M_ : M_; }

  void end_step(StepContext& c) override {
    if (c.cache.entries() < heads() * (M_ + buffer_)) return;
    const int64_t fed = c.tokens_fed();
    const int64_t L = c.cache.n_layers(), K = c.cache.n_kv_heads();
    std::vector<std::vector<Entry>> per_head(size_t(L * K));
    std::vector<Entry> all;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h)
        for (int32_t p : c.cache.positions(l, h, 0)) {
          Entry e{score(l, h, p, fed), int32_t(l), int32_t(h), p};
          per_head[size_t(l * K + h)].push_back(e);
          all.push_back(e);
        }
    for (auto& v : per_head) std::sort(v.begin(), v.end(), better);
    // How many entries each head keeps.
    std::vector<int64_t> keep(size_t(L * K), 0);
    if (min_ == 0) {
      const size_t total = size_t(heads() * M_);
      if (all.size() > total) std::nth_element(all.begin(), all.begin() + total, all.end(), better);
      for (size_t k = 0; k < std::min(total, all.size()); ++k)
        ++keep[size_t(all[k].layer * K + all[k].head)];
    } else {
      // Official order: the global top L*K*(M - min) decide the extra room,
      // then every head keeps min more of its own best.
      const size_t adaptive = size_t(heads() * (M_ - min_));
      if (all.size() > adaptive)
        std::nth_element(all.begin(), all.begin() + adaptive, all.end(), better);
      for (size_t k = 0; k < std::min(adaptive, all.size()); ++k)
        ++keep[size_t(all[k].layer * K + all[k].head)];
      for (int64_t& k : keep) k += min_;
    }
    for (int64_t i = 0; i < L * K; ++i) {
      const auto& v = per_head[size_t(i)];
      for (size_t k = size_t(keep[size_t(i)]); k < v.size(); ++k)
        c.decide.evict(v[k].layer, v[k].head, v[k].pos, float(v[k].score), 1);
    }
  }

 private:
  int64_t heads() const { return setup_.model->n_layers * setup_.model->n_kv_heads; }
  int64_t M_, buffer_, min_;
};

}  // namespace

PolicyDescriptor dbtrimkv_descriptor() {
  PolicyDescriptor d = {
      "dbtrimkv",
      "globally calibrated retention gates: one budget over all layers and heads (unequal per-head "
      "budgets)",
      "Make Each Token Count: Towards Improving Long-Context Performance with KV Cache Eviction "
      "(DBTrimKV), seed 002",
      "docs/policies/dbtrimkv.md",
      {{"gates", ParamType::String, "",
        "gate file: kvscope .safetensors (retention-global, or retention) or official TrimKV "
        "checkpoint"},
       {"budget", ParamType::Int, "128",
        "M: the average entries per (layer, kv head); the cache keeps L*K*M in all"},
       {"buffer", ParamType::Int, "1", "compress when the cache holds L*K*(M + buffer)"},
       {"min", ParamType::Int, "0",
        "entries every head keeps whatever its scores (official min_tokens_per_head)"},
       {"lookahead", ParamType::Int, "1", "n of the multi-step score (seed 002 §4.2)"},
       {"window", ParamType::Int, "0", "most recent tokens never evicted"}},
      [](const Params& p) {
        if (p.get_int("budget") < 1 || p.get_int("buffer") < 1 || p.get_int("min") < 0 ||
            p.get_int("min") > p.get_int("budget") || p.get_int("lookahead") < 1 ||
            p.get_int("window") < 0)
          throw InputError(
              "--policy", "dbtrimkv",
              "budget >= 1, buffer >= 1, 0 <= min <= budget, lookahead >= 1, window >= 0 expected");
        if (p.get_string("gates").empty())
          throw InputError("--policy", "dbtrimkv:gates",
                           "a gate file is required (e.g. "
                           "dbtrimkv:gates=resources/gates/<model>-retention-global.safetensors)");
        return std::make_unique<DbTrimKvPolicy>(p.get_string("gates"), p.get_int("budget"),
                                                p.get_int("buffer"), p.get_int("min"),
                                                p.get_int("lookahead"), p.get_int("window"));
      }};
  d.gate_kinds = {"retention-global", "retention"};
  return d;
}

}  // namespace kvscope::policy
