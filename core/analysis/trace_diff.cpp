#include "core/analysis/trace_diff.h"

#include <algorithm>

#include "core/common/input_error.h"

namespace kvscope::analysis {

void check_comparable(const trace::TraceReader& a, const trace::TraceReader& b) {
  auto shape = [](const trace::TraceReader& r) {
    return std::to_string(r.n_layers()) + " layers x " + std::to_string(r.n_kv_heads()) +
           " kv heads";
  };
  if (a.n_layers() != b.n_layers() || a.n_kv_heads() != b.n_kv_heads())
    throw InputError(b.path(), "/run model",
                     "has " + shape(b) + "; the compared trace " + a.path() + " has " + shape(a) +
                         " (expected the same model)");
  std::vector<trace::TokenRecord> ta = a.tokens(0, a.n_tokens()), tb = b.tokens(0, b.n_tokens());
  for (size_t i = 0; i < std::min(ta.size(), tb.size()); ++i) {
    bool prompt_a = ta[i].role != trace::TokenRole::Generated;
    bool prompt_b = tb[i].role != trace::TokenRole::Generated;
    if (!prompt_a || !prompt_b) break;
    if (ta[i].id != tb[i].id)
      throw InputError(b.path(), "/tokens/id",
                       "token " + std::to_string(i) + " is " + std::to_string(tb[i].id) + " but " +
                           std::to_string(ta[i].id) + " in " + a.path() +
                           " (expected two traces of the same prompt)");
  }
}

int64_t aligned_step(const std::vector<int32_t>& to_fed_step,
                     const std::vector<trace::StepRecord>& from_steps, int64_t step) {
  if (from_steps.empty() || to_fed_step.empty()) return 0;
  step = std::clamp<int64_t>(step, 0, int64_t(from_steps.size()) - 1);
  const trace::StepRecord& s = from_steps[size_t(step)];
  int64_t last =
      std::min<int64_t>(int64_t(s.first_token) + s.n_tokens - 1, int64_t(to_fed_step.size()) - 1);
  return last < 0 ? 0 : to_fed_step[size_t(last)];
}

int64_t shared_prefix(const trace::TraceReader& a, const trace::TraceReader& b) {
  int64_t n = std::min(a.n_tokens(), b.n_tokens());
  std::vector<trace::TokenRecord> ta = a.tokens(0, n), tb = b.tokens(0, n);
  for (int64_t i = 0; i < n; ++i)
    if (ta[size_t(i)].id != tb[size_t(i)].id) return i;
  return n;
}

std::vector<HeadDiffCounts> diff_heads(const AllLifetimes& a, const AllLifetimes& b, int64_t step_a,
                                       int64_t step_b, int64_t token_end) {
  std::vector<HeadDiffCounts> out(size_t(a.layers * a.kv_heads));
  int64_t t0 = std::max(a.token_begin, b.token_begin), t1 = std::min(a.token_end, b.token_end);
  if (token_end >= 0) t1 = std::min(t1, token_end);
  for (int64_t l = 0; l < a.layers; ++l)
    for (int64_t k = 0; k < a.kv_heads; ++k) {
      HeadDiffCounts& c = out[size_t(l * a.kv_heads + k)];
      for (int64_t t = t0; t < t1; ++t) {
        bool ha = a.held(l, k, t, step_a), hb = b.held(l, k, t, step_b);
        c.only_a += ha && !hb;
        c.only_b += hb && !ha;
        c.both += ha && hb;
      }
    }
  return out;
}

std::vector<uint8_t> diff_tokens(const AllLifetimes& a, const AllLifetimes& b, int64_t layer,
                                 int64_t kv_head, int64_t step_a, int64_t step_b,
                                 int64_t token_end) {
  int64_t t0 = std::max(a.token_begin, b.token_begin), t1 = std::min(a.token_end, b.token_end);
  if (token_end >= 0) t1 = std::min(t1, token_end);
  std::vector<uint8_t> out(size_t(std::max<int64_t>(0, t1)), kHeldByNeither);
  for (int64_t t = t0; t < t1; ++t) {
    bool ha = a.held(layer, kv_head, t, step_a), hb = b.held(layer, kv_head, t, step_b);
    out[size_t(t)] = uint8_t((ha ? kOnlyA : 0) | (hb ? kOnlyB : 0));
  }
  return out;
}

SpanDiff diff_span(const AllLifetimes& a, const AllLifetimes& b, const std::vector<int64_t>& span,
                   const std::vector<int64_t>& step_b) {
  SpanDiff d;
  d.heads = a.layers * a.kv_heads;
  d.steps = int64_t(step_b.size());
  d.only_a.assign(size_t(d.heads * d.steps), 0.f);
  d.only_b.assign(d.only_a.size(), 0.f);
  if (span.empty()) return d;
  auto held = [](const AllLifetimes& x, int64_t l, int64_t k, int64_t t, int64_t s) {
    return t >= x.token_begin && t < x.token_end && x.held(l, k, t, s);
  };
  const float share = 1.f / float(span.size());
  for (int64_t l = 0; l < a.layers; ++l)
    for (int64_t k = 0; k < a.kv_heads; ++k) {
      const int64_t h = l * a.kv_heads + k;
      for (int64_t s = 0; s < d.steps; ++s)
        for (int64_t t : span) {
          const bool ha = held(a, l, k, t, s), hb = held(b, l, k, t, step_b[size_t(s)]);
          d.only_a[size_t(h * d.steps + s)] += ha && !hb ? share : 0.f;
          d.only_b[size_t(h * d.steps + s)] += hb && !ha ? share : 0.f;
        }
    }
  return d;
}

}  // namespace kvscope::analysis
