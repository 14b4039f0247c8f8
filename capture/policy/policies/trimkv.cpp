// trimkv: learned token retention with a per-head budget (Bui et al., "Cache
// What Lasts: Token Retention for Memory-Bounded KV Cache in LLMs", 2025;
// seed 002 §2.2 restates it). A small gate on the layer's normalised input
// gives every token a retention beta in (0, 1) per kv head when it enters the
// cache; after every step (the official TrimKVCache.compress after the
// forward pass) a head holding M + buffer entries keeps the M with the
// highest log(beta) * (t + 1 - position) and evicts the rest. Attention over
// the kept entries is ordinary attention (beta only decides eviction).
// docs/policies/trimkv.md
#include <algorithm>
#include <numeric>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/retention_gates.h"

namespace kvscope::policy {

namespace {

class TrimKvPolicy : public RetentionGatePolicy {
 public:
  TrimKvPolicy(std::string path, int64_t budget, int64_t buffer, int64_t lookahead, int64_t window)
      : RetentionGatePolicy("trimkv", std::move(path), lookahead, window),
        M_(budget),
        buffer_(buffer) {}

  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return M_; }

  void end_step(StepContext& c) override {
    const int64_t fed = c.tokens_fed();
    for (int64_t l = 0; l < c.cache.n_layers(); ++l)
      for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
        if (c.cache.count(l, h) < M_ + buffer_) continue;
        std::vector<std::pair<double, int64_t>> held;  // (score, position)
        for (int32_t p : c.cache.positions(l, h, 0)) held.push_back({score(l, h, p, fed), p});
        // Highest scores first; a tie keeps the newer token.
        std::sort(held.begin(), held.end(), [](auto& a, auto& b) {
          return a.first != b.first ? a.first > b.first : a.second > b.second;
        });
        for (size_t k = size_t(M_); k < held.size(); ++k)
          c.decide.evict(l, h, held[k].second, float(held[k].first), 1);
      }
  }

 private:
  int64_t M_, buffer_;
};

}  // namespace

PolicyDescriptor trimkv_descriptor() {
  PolicyDescriptor d = {
      "trimkv",
      "learned retention gates (beta per token and kv head); keep the top-M of log(beta)*(t+1-pos) "
      "per head",
      "Bui et al., Cache What Lasts: Token Retention for Memory-Bounded KV Cache in LLMs (TrimKV), "
      "2025",
      "docs/policies/trimkv.md",
      {{"gates", ParamType::String, "",
        "gate file: kvscope .safetensors (retention) or official trimkv_weights.pth / its "
        "directory"},
       {"budget", ParamType::Int, "128", "M: entries kept per (layer, kv head)"},
       {"buffer", ParamType::Int, "1", "evict when a head holds M + buffer (official buffer_size)"},
       {"lookahead", ParamType::Int, "1",
        "n of the multi-step score (1: TrimKV's log(beta)*(t+1-pos))"},
       {"window", ParamType::Int, "0",
        "most recent tokens never evicted (official sliding_window_size)"}},
      [](const Params& p) {
        if (p.get_int("budget") < 1 || p.get_int("buffer") < 1 || p.get_int("lookahead") < 1 ||
            p.get_int("window") < 0)
          throw InputError("--policy", "trimkv",
                           "budget >= 1, buffer >= 1, lookahead >= 1, window >= 0 expected");
        if (p.get_string("gates").empty())
          throw InputError("--policy", "trimkv:gates",
                           "a gate file is required (e.g. "
                           "trimkv:gates=resources/gates/<model>-retention.safetensors)");
        return std::make_unique<TrimKvPolicy>(p.get_string("gates"), p.get_int("budget"),
                                              p.get_int("buffer"), p.get_int("lookahead"),
                                              p.get_int("window"));
      }};
  d.gate_kinds = {"retention"};
  return d;
}

}  // namespace kvscope::policy
