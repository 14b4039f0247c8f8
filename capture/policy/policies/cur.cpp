// cur: CurDKV (Sengupta et al., "Value-Guided KV Compression for LLMs via
// Approximated CUR Decomposition", 2025), as kvpress's CURPress computes it.
// CUR decomposition keeps the rows of largest leverage; CurDKV approximates
// the leverage of key and value rows by their squared norms, normalised
// within local windows of `window` positions:
//   k2(j) = ||k_j||^2 / sum_{i in window(j)} ||k_i||^2,  v2 likewise,
//   score = k2 * v2 (leverage=kv_product; key, value, kv_avg = (k2 + v2) / 2),
// normalised over the head, with the first `sinks` entries scored 1 (kept).
// With `random=true` keys and values are first projected by a Gaussian
// G [hd, 20] / sqrt(20), drawn from a generator seeded with `seed` (kvpress:
// the global torch generator, one draw per layer and compression, same order).
// docs/policies/cur.md
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"
#include "kernels/cpu/float_loops.h"

namespace kvscope::policy {

namespace {

struct CurOptions {
  int64_t sinks = 4, window = 16;
  std::string leverage = "kv_product";
  bool local = true, random = false;
  uint64_t seed = 0;
};

class CurScorer : public HeadScorer {
 public:
  explicit CurScorer(CurOptions o)
      : o_(std::move(o)), gen_(at::detail::createCPUGenerator(o_.seed)) {}
  std::string score_name() const override { return "cur_leverage"; }
  std::string score_meaning() const override {
    return "approximate CUR leverage of the entry (" + o_.leverage +
           " of locally normalised squared norms), normalised per head; sinks 1";
  }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const HeldRows r = held_rows(c.cache, c.layer, kv_head);
    const int64_t n = r.size();
    if (n == 0) return;
    if (o_.random) return score_projected(c, r, out);
    // Squared norms, local normalisation and the combination in plain loops:
    // a decode step scores a few hundred rows per head, where a dozen tensor
    // ops per head cost more than the arithmetic (docs/performance.md).
    const int64_t d = r.keys.size(1);
    const float *k = r.keys.data_ptr<float>(), *v = r.values.data_ptr<float>();
    k2_.resize(size_t(n)), v2_.resize(size_t(n));
    for (int64_t j = 0; j < n; ++j) {
      k2_[size_t(j)] = kernels::cpu::dot(k + j * d, k + j * d, d);
      v2_[size_t(j)] = kernels::cpu::dot(v + j * d, v + j * d, d);
    }
    if (o_.local) local_normalise(k2_), local_normalise(v2_);
    float total = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float a = k2_[size_t(j)], b = v2_[size_t(j)];
      const float sj = o_.leverage == "key"      ? a
                       : o_.leverage == "value"  ? b
                       : o_.leverage == "kv_avg" ? (a + b) / 2
                                                 : a * b;
      k2_[size_t(j)] = sj;
      total += sj;
    }
    for (int64_t j = 0; j < n; ++j)
      out[r.pos[size_t(j)]] = j < o_.sinks ? 1.0f : k2_[size_t(j)] / total;
  }

 private:
  // random=true: keys and values projected by the Gaussian first (tensor ops).
  void score_projected(const LayerContext& c, const HeldRows& r, float* out) {
    const int64_t n = r.size();
    // One projection per (layer, step), shared by the layer's heads: kvpress
    // draws G once per compression of a layer.
    if (c.layer != drawn_layer_ || c.step != drawn_step_) {
      projection_ = torch::randn({r.keys.size(1), 20}, gen_, torch::kFloat32) / std::sqrt(20.0);
      drawn_layer_ = c.layer, drawn_step_ = c.step;
    }
    const torch::Tensor k = r.keys.matmul(projection_), v = r.values.matmul(projection_);
    torch::Tensor k2 = k.pow(2).sum(-1), v2 = v.pow(2).sum(-1);  // [n]
    if (o_.local) k2 = local_normalise(k2), v2 = local_normalise(v2);
    torch::Tensor s;
    if (o_.leverage == "key")
      s = k2;
    else if (o_.leverage == "value")
      s = v2;
    else if (o_.leverage == "kv_avg")
      s = (k2 + v2) / 2;
    else
      s = k2 * v2;
    s = (s / s.sum()).contiguous();
    const float* p = s.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) out[r.pos[size_t(j)]] = j < o_.sinks ? 1.0f : p[j];
  }

  // x / (sum over its window of `window` entries), the last window padded
  // with zeros (F.pad), as kvpress does.
  void local_normalise(std::vector<float>& x) const {
    const int64_t n = int64_t(x.size()), w = o_.window;
    for (int64_t b = 0; b < n; b += w) {
      const int64_t e = std::min(b + w, n);
      float sum = 0;
      for (int64_t j = b; j < e; ++j) sum += x[size_t(j)];
      for (int64_t j = b; j < e; ++j) x[size_t(j)] /= sum;
    }
  }

  // x / (sum over its window of `window` positions), the last window padded
  // with zeros (F.pad), as kvpress does.
  torch::Tensor local_normalise(const torch::Tensor& x) const {
    const int64_t n = x.size(0), w = o_.window, pad = (w - n % w) % w;
    torch::Tensor t = torch::cat({x, torch::zeros({pad}, x.options())}).reshape({-1, w});
    return (t / t.sum(-1, true)).reshape({-1}).narrow(0, 0, n);
  }

  CurOptions o_;
  at::Generator gen_;
  torch::Tensor projection_;
  int64_t drawn_layer_ = -1, drawn_step_ = -1;
  std::vector<float> k2_, v2_;  // scratch of score()
};

std::vector<ParamSpec> cur_params() {
  return {{"sinks", ParamType::Int, "4", "first entries always kept"},
          {"window", ParamType::Int, "16", "local window of the norm normalisation", 1},
          {"local", ParamType::Bool, "true", "normalise within local windows (false: per head)"},
          {"leverage", ParamType::String, "kv_product", "kv_product, kv_avg, key or value"},
          {"random", ParamType::Bool, "false", "project keys and values by a Gaussian [hd, 20]"},
          {"seed", ParamType::Int, "0", "seed of the Gaussian projection", 0}};
}

std::unique_ptr<HeadScorer> make_cur(const Params& p) {
  CurOptions o;
  o.sinks = p.get_int("sinks"), o.window = p.get_int("window"), o.local = p.get_bool("local");
  o.leverage = p.get_string("leverage"), o.random = p.get_bool("random");
  o.seed = uint64_t(p.get_int("seed"));
  if (o.sinks < 0) throw InputError("--policy", "cur:sinks", "must be >= 0");
  if (o.leverage != "kv_product" && o.leverage != "kv_avg" && o.leverage != "key" &&
      o.leverage != "value")
    throw InputError("--policy", "cur:leverage",
                     "kv_product, kv_avg, key or value expected, got '" + o.leverage + "'");
  return std::make_unique<CurScorer>(o);
}

}  // namespace

ScorerDescriptor cur_scorer() {
  return {"cur", cur_params(), make_cur};
}

PolicyDescriptor cur_descriptor() {
  std::vector<ParamSpec> params = {
      {"budget", ParamType::Int, "256", "entries kept per head (sinks included)"},
      {"decode", ParamType::Bool, "true",
       "also compress at every decode step (false: prefill only, as kvpress)"}};
  for (const ParamSpec& s : cur_params()) params.push_back(s);
  return {"cur",
          "CurDKV: approximate CUR leverage of keys and values (locally normalised squared norms)",
          "Sengupta et al., Value-Guided KV Compression for LLMs via Approximated CUR "
          "Decomposition, 2025 (kvpress CURPress)",
          "docs/policies/cur.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1) throw InputError("--policy", "cur:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_cur(p),
                                                  std::vector<int64_t>{p.get_int("budget")},
                                                  p.get_bool("decode"), "lowest CUR leverage");
          }};
}

}  // namespace kvscope::policy
