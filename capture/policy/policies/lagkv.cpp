// lagkv: LagKV (Liang et al., "LagKV: Lag-Relative Information of the KV
// Cache Tells Which Tokens Are Important", 2025), as kvpress's LagKVPress
// computes it. The held entries after `sinks` are cut into partitions of
// `lag` entries (in position order); each partition is judged against the
// next one, its "lag reference": with min_r, max_r the per-channel min and
// max of the next partition,
//   s_K(j) = softmax_partition( std_channels( (k_j - min_r) / (max_r - min_r) ) )
// (unbiased std), s_V likewise on values, score = (s_K + s_V) / 2, and within
// each partition entries are ranked: score = rank / lag (cross=false; true
// keeps the raw score, for adakv). The sinks and the last partition plus the
// remainder (it has no reference yet) score 1 and always stay. Fewer than sinks + 2 lag
// entries: nothing is scored but position (the newest stay).
// docs/policies/lagkv.md
#include <torch/torch.h>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class LagKvScorer : public HeadScorer {
 public:
  LagKvScorer(int64_t sinks, int64_t lag, bool cross) : sinks_(sinks), lag_(lag), cross_(cross) {}
  std::string score_name() const override { return "lagkv"; }
  std::string score_meaning() const override {
    return cross_ ? "lag-relative score of keys and values against the next partition"
                  : "rank of the lag-relative score within its partition / lag (sinks and the "
                    "last partition: max)";
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const HeldRows r = held_rows(c.cache, c.layer, kv_head);
    const int64_t n = r.size();
    const float keep = 1.0f;  // kvpress's score for the sinks and the tail (ranks are < 1)
    if (n < sinks_ + 2 * lag_) {  // kvpress: no compression, the sliding part by position
      for (int64_t j = 0; j < n; ++j)
        out[r.pos[size_t(j)]] = j < sinks_ ? 1.0f : float(j - sinks_) / float(n - sinks_);
      return;
    }
    const int64_t end = sinks_ + ((n - sinks_) / lag_) * lag_, parts = (end - sinks_) / lag_;
    torch::Tensor s = (states_score(r.keys, end, parts) + states_score(r.values, end, parts)) / 2;
    if (!cross_) s = s.argsort(int64_t{-1}).argsort(int64_t{-1}).to(torch::kFloat32) / float(lag_);
    s = s.reshape({-1}).contiguous();  // [(parts - 1) * lag]
    const float* p = s.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) {
      const bool scored = j >= sinks_ && j < end - lag_;
      out[r.pos[size_t(j)]] = scored ? p[j - sinks_] : keep;
    }
  }

 private:
  // [parts - 1, lag]: each partition against the next one's channel range.
  torch::Tensor states_score(const torch::Tensor& x, int64_t end, int64_t parts) const {
    torch::Tensor t = x.narrow(0, sinks_, end - sinks_).reshape({parts, lag_, x.size(1)});
    torch::Tensor ref = t.narrow(0, 1, parts - 1), v = t.narrow(0, 0, parts - 1);
    torch::Tensor min_r = std::get<0>(ref.min(1, true)), max_r = std::get<0>(ref.max(1, true));
    return ((v - min_r) / (max_r - min_r)).std(-1).softmax(-1);
  }

  int64_t sinks_, lag_;
  bool cross_;
};

std::vector<ParamSpec> lagkv_params() {
  return {{"sinks", ParamType::Int, "4", "first entries always kept"},
          {"lag", ParamType::Int, "128", "partition size: each is scored against the next", 1},
          {"cross", ParamType::Bool, "false",
           "raw scores across partitions (true) instead of ranks within each (for adakv)"}};
}

std::unique_ptr<HeadScorer> make_lagkv(const Params& p) {
  if (p.get_int("sinks") < 0) throw InputError("--policy", "lagkv:sinks", "must be >= 0");
  return std::make_unique<LagKvScorer>(p.get_int("sinks"), p.get_int("lag"), p.get_bool("cross"));
}

}  // namespace

ScorerDescriptor lagkv_scorer() {
  return {"lagkv", lagkv_params(), make_lagkv};
}

PolicyDescriptor lagkv_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head (sinks and the tail included)"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  for (const ParamSpec& s : lagkv_params()) params.push_back(s);
  return {"lagkv",
          "lag-relative information: each partition of `lag` entries scored against the next one",
          "Liang et al., LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are "
          "Important, 2025 (kvpress LagKVPress)",
          "docs/policies/lagkv.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "lagkv:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_lagkv(p),
                                                  std::vector<int64_t>{p.get_int("budget")},
                                                  p.get_bool("decode"), "lowest lag-relative rank");
          }};
}

}  // namespace kvscope::policy
