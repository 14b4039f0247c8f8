#include "core/analysis/deferred_retention.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "core/analysis/lifetimes.h"

namespace kvscope::analysis {

namespace {

using trace::TokenRole;

struct Needed {
  std::vector<int32_t> needles;  // needle token indices, ascending
  int64_t question_begin = -1;
};

// The Needle tokens before the final run of Question tokens.
Needed find_needles(const trace::TraceReader& r) {
  Needed out;
  const std::vector<uint8_t> roles = r.token_roles(0, r.n_tokens());
  const auto is = [&](int64_t t, TokenRole role) { return roles[size_t(t)] == uint8_t(role); };
  int64_t q = int64_t(roles.size()) - 1;
  while (q >= 0 && !is(q, TokenRole::Question)) --q;
  if (q < 0) return out;
  while (q > 0 && is(q - 1, TokenRole::Question)) --q;
  out.question_begin = q;
  for (int64_t t = 0; t < q; ++t)
    if (is(t, TokenRole::Needle)) out.needles.push_back(int32_t(t));
  return out;
}

// The step that fed token t (steps feed tokens in order, without gaps).
int64_t step_of(const std::vector<trace::StepRecord>& steps, int64_t t) {
  auto it = std::upper_bound(
      steps.begin(), steps.end(), t,
      [](int64_t tok, const trace::StepRecord& s) { return tok < int64_t(s.first_token); });
  return int64_t(it - steps.begin()) - 1;
}

}  // namespace

std::optional<DeferredRetention> deferred_retention(const trace::TraceReader& r) {
  const int64_t S = r.n_steps();
  if (S == 0 || r.n_tokens() == 0) return std::nullopt;
  const Needed found = find_needles(r);
  if (found.needles.empty()) return std::nullopt;
  const std::vector<trace::StepRecord> steps = r.steps(0, S);
  const int64_t first = step_of(steps, found.question_begin);
  if (first < 0 || first >= S) return std::nullopt;

  const int64_t L = r.n_layers(), K = r.n_kv_heads();
  const std::vector<uint8_t>& flags = r.tier_attended();
  const auto attended = [&](int64_t tier) {
    if (tier < 0 || tier == trace::kNoTier) return false;
    return size_t(tier) >= flags.size() || flags[size_t(tier)] != 0;
  };
  const std::vector<int32_t>& needles = found.needles;
  const int32_t nb = needles.front(), ne = needles.back() + 1;
  std::vector<int64_t> fed(needles.size());
  for (size_t i = 0; i < needles.size(); ++i) fed[i] = step_of(steps, needles[i]);

  // Promotions of needle tokens into an attended tier during the needed steps:
  // (step, layer * K + kv head, token).
  std::set<std::tuple<int64_t, int64_t, int32_t>> promoted_at;
  const int64_t event_end = r.n_events();
  constexpr int64_t kBlock = int64_t(1) << 16;
  for (int64_t e0 = steps[size_t(first)].event_begin; e0 < event_end; e0 += kBlock)
    for (const trace::Event& e : r.events(e0, std::min(event_end, e0 + kBlock)))
      if (e.kind == trace::EventKind::Promote && attended(e.to_tier) &&
          std::binary_search(needles.begin(), needles.end(), e.token))
        promoted_at.emplace(e.step, int64_t(e.layer) * K + e.kv_head, e.token);

  // Where each needle token sat: lifetimes (one tier) or tier intervals.
  const bool tiered = r.n_tiers() > 1;
  const AllLifetimes life = tiered ? AllLifetimes{} : AllLifetimes::read(r, nb, ne);

  DeferredRetention d;
  d.needle_tokens = int64_t(needles.size());
  d.question_begin = found.question_begin;
  d.first_needed_step = first;
  d.needed_steps = S - first;
  d.layer_rate.assign(size_t(L), 0.0);
  for (int64_t l = 0; l < L; ++l) {
    int64_t layer_checks = 0, layer_available = 0;
    for (int64_t k = 0; k < K; ++k) {
      std::vector<std::vector<trace::TierInterval>> stays(needles.size());
      if (tiered)
        for (const trace::TierInterval& iv : r.intervals(int(l), int(k))) {
          auto it = std::lower_bound(needles.begin(), needles.end(), iv.token);
          if (it != needles.end() && *it == iv.token)
            stays[size_t(it - needles.begin())].push_back(iv);
        }
      for (size_t i = 0; i < needles.size(); ++i) {
        const int32_t t = needles[i];
        // In an attended tier at the end of step p?
        const auto attended_after = [&](int64_t p) {
          if (!tiered) {
            const size_t at = life.index(l, k, t);
            const int32_t admit = life.admit[at], evict = life.evict[at];
            return admit >= 0 && admit <= p && (evict < 0 || evict > p) && attended(0);
          }
          for (const trace::TierInterval& iv : stays[i])
            if (iv.begin_step <= p && (iv.end_step < 0 || iv.end_step > p) && attended(iv.tier))
              return true;
          return false;
        };
        bool always = true;
        for (int64_t s = first; s < S; ++s) {
          bool ok = fed[i] == s || attended_after(s - 1);
          if (!ok && promoted_at.count({s, l * K + k, t}) > 0) {
            ok = true;
            ++d.promoted;
          }
          ++layer_checks;
          layer_available += ok ? 1 : 0;
          always = always && ok;
        }
        ++d.pairs;
        d.pairs_always += always ? 1 : 0;
      }
    }
    d.checks += layer_checks;
    d.available += layer_available;
    d.layer_rate[size_t(l)] =
        layer_checks > 0 ? double(layer_available) / double(layer_checks) : 0.0;
  }
  d.rate = d.checks > 0 ? double(d.available) / double(d.checks) : 0.0;
  d.always_share = d.pairs > 0 ? double(d.pairs_always) / double(d.pairs) : 0.0;
  return d;
}

}  // namespace kvscope::analysis
