// pyramidkv: PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache Compression
// based on Pyramidal Information Funneling", 2024). SnapKV's scores with a
// budget per layer that shrinks linearly from the bottom layer to the top:
// with P = budget - window the mean prefix budget,
//   k_top = P / beta,  k_bottom = 2P - k_top,
//   budget(l) = window + round(k_bottom - l (k_bottom - k_top) / (L - 1)),
// so the layers average `budget` entries per head (the official
// KVCache-Factory arithmetic). docs/policies/pyramidkv.md
#include <cmath>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

std::vector<int64_t> pyramid_budgets(int64_t layers, int64_t budget, int64_t window, double beta) {
  const double prefix = double(budget - window);
  const double k_top = prefix / beta, k_bottom = 2 * prefix - k_top;
  const double step = layers > 1 ? (k_bottom - k_top) / double(layers - 1) : 0.0;
  std::vector<int64_t> out;
  for (int64_t l = 0; l < layers; ++l)
    out.push_back(layers > 1 ? window + int64_t(std::llround(k_bottom - double(l) * step))
                             : budget);
  return out;
}

std::vector<int64_t> pyramid_budgets_kvpress(int64_t layers, int64_t budget, int64_t window,
                                             double beta, int64_t T) {
  // Python's round() (half to even), as kvpress computes them.
  auto round_even = [](double x) { return int64_t(std::nearbyint(x)); };
  const double P = double(budget);
  double min_num = P / beta, max_num = 2 * P - min_num;
  if (max_num >= double(T - window)) {
    max_num = double(T - window);
    min_num = 2 * P - max_num;
  }
  if (!(double(T) >= max_num && max_num >= min_num && min_num >= double(window)))
    return std::vector<int64_t>(size_t(layers), std::max<int64_t>(1, round_even(P)));
  const double step = layers > 1 ? (max_num - min_num) / double(layers - 1) : 0.0;
  std::vector<int64_t> out;
  for (int64_t l = 0; l < layers; ++l) out.push_back(round_even(max_num - double(l) * step));
  return out;
}

PolicyDescriptor pyramidkv_descriptor() {
  const ScorerDescriptor snap = snapkv_scorer();
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256",
       "mean entries kept per head over the layers, window included"},
      {"beta", ParamType::Float, "20",
       "pyramid steepness: top layer keeps (budget - window) / beta prefix entries", 1, 1e6},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step, per-layer budgets unchanged (false: the paper, prefill "
       "only)"},
      {"spread", ParamType::String, "prefix",
       "prefix: the paper's code (the prefix budget on the sequence, the window added to every "
       "layer); all: kvpress PyramidKVPress (the whole budget on the sequence, SnapKV's uniform "
       "budget where the pyramid would not fit the prompt)"}};
  for (const ParamSpec& s : snap.params) params.push_back(s);
  return {"pyramidkv",
          "SnapKV scores with pyramid-shaped layer budgets (more below, fewer above)",
          "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
          "Funneling, 2024",
          "docs/policies/pyramidkv.md",
          params,
          [snap](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < p.get_int("window"))
              throw InputError("--policy", "pyramidkv:budget",
                               "must be >= window (the window is always kept)");
            if (p.get_float("beta") < 1)
              throw InputError("--policy", "pyramidkv:beta", "must be >= 1");
            auto policy = std::make_unique<ScoredPolicy>(
                snap.make(p), std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
                "lowest pooled window vote");
            policy->set_scorer_name("snapkv");
            policy->shape().pyramid_beta = p.get_float("beta");
            const std::string& spread = p.get_string("spread");
            if (spread != "prefix" && spread != "all")
              throw InputError("--policy", "pyramidkv:spread",
                               "'prefix' or 'all' expected, got '" + spread + "'");
            policy->shape().pyramid_whole = spread == "all";
            return policy;
          }};
}

}  // namespace kvscope::policy
