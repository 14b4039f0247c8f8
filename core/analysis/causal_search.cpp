#include "core/analysis/causal_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <stdexcept>

namespace kvscope::analysis {

namespace {

using Set = std::vector<uint8_t>;

struct BudgetSpent {};  // thrown out of a phase when the budget is gone

class Search {
 public:
  Search(const CausalQuery& q, const ReplayEvaluator& evaluate) : q_(q), evaluate_(evaluate) {
    const size_t n = size_t(q.layers * q.kv_heads);
    if (q.layers <= 0 || q.kv_heads <= 0 || q.head_score.size() != n || q.lost.size() != n)
      throw std::invalid_argument(
          "causal_search: head_score and lost need layers x kv_heads values");
    if (q.budget < 1) throw std::invalid_argument("causal_search: the budget must be >= 1");
    r_.original = q.original;
    r_.budget = q.budget;
  }

  CausalResult run() {
    try {
      full_restoration();
      // Nothing smaller can recover what everything does not: no more replays.
      if (!r_.recoverable) return std::move(r_);
      minimal_heads(minimal_layers());
      single_effects();
    } catch (const BudgetSpent&) {
      r_.budget_exhausted = true;
      // The smallest recovering set seen stands for the search that could not finish.
      if (!r_.minimal_confirmed && !best_.empty()) r_.minimal = best_;
    }
    return std::move(r_);
  }

 private:
  // ---- replays ----
  // The effect of a replay, run once per distinct request; *index: its place in replays.
  ReplayEffect replay(const Set& restore, const Set& drop, const std::string& label,
                      int64_t* index = nullptr) {
    const std::string key = key_of(restore) + "|" + key_of(drop);
    auto it = seen_.find(key);
    if (it == seen_.end()) {
      if (int64_t(r_.replays.size()) >= q_.budget) throw BudgetSpent{};
      ReplayRecord rec{{restore, drop, label}, {}, false};
      rec.effect = evaluate_(rec.request);
      rec.recovered = recovers(rec.effect);
      if (rec.recovered && drop.empty() && r_.recoverable &&
          (best_.empty() || size(restore) < size(best_)))
        best_ = restore;
      r_.replays.push_back(rec);
      it = seen_.emplace(key, int64_t(r_.replays.size()) - 1).first;
    }
    if (index) *index = it->second;
    return r_.replays[size_t(it->second)].effect;
  }
  static std::string key_of(const Set& s) { return std::string(s.begin(), s.end()); }
  static int64_t size(const Set& s) { return std::count(s.begin(), s.end(), uint8_t(1)); }

  bool recovers(const ReplayEffect& e) const {
    if (!std::isnan(r_.threshold) && !std::isnan(e.logprob)) return e.logprob >= r_.threshold;
    if (r_.full.success == 1) return e.success == 1;
    return !std::isnan(e.score) && !std::isnan(r_.full.score) && e.score >= r_.full.score;
  }

  Set empty_set() const { return Set(size_t(q_.layers * q_.kv_heads), 0); }
  Set layers_set(const std::vector<int64_t>& layers) const {
    Set s = empty_set();
    for (int64_t l : layers)
      for (int64_t k = 0; k < q_.kv_heads; ++k)
        s[size_t(l * q_.kv_heads + k)] = q_.lost[size_t(l * q_.kv_heads + k)];
    return s;
  }
  Set heads_set(const std::vector<int64_t>& heads) const {
    Set s = empty_set();
    for (int64_t h : heads) s[size_t(h)] = 1;
    return s;
  }
  bool restores(const Set& s, const std::string& label) { return recovers(replay(s, {}, label)); }

  // ---- phases ----
  // Every loss restored: the ceiling a smaller set is measured against.
  void full_restoration() {
    r_.full = replay(q_.lost, {}, "every head that lost anything");
    const double lp0 = q_.original.logprob, lp1 = r_.full.logprob;
    if (!std::isnan(lp0) && !std::isnan(lp1) && lp1 - lp0 > q_.min_gap)
      r_.threshold = lp0 + q_.fraction * (lp1 - lp0);
    // Without a log-probability to compare, the full restoration must do
    // better than the policy's run by success or score.
    r_.recoverable = !std::isnan(r_.threshold) ||
                     (r_.full.success == 1 && q_.original.success != 1) ||
                     (!std::isnan(r_.full.score) && !(r_.full.score <= q_.original.score));
    // The threshold did not exist when the full restoration ran: judge it now.
    r_.replays.front().recovered = r_.recoverable && recovers(r_.full);
  }

  double layer_score(int64_t l) const {
    double s = 0;
    for (int64_t k = 0; k < q_.kv_heads; ++k) s += q_.head_score[size_t(l * q_.kv_heads + k)];
    return s;
  }

  // Items ordered by score, strongest first (ties: lower index first).
  template <typename Score>
  static std::vector<int64_t> ranked(std::vector<int64_t> items, Score score) {
    std::stable_sort(items.begin(), items.end(),
                     [&](int64_t a, int64_t b) { return score(a) > score(b); });
    return items;
  }

  // The smallest recovering prefix of `items` (bisection; the whole list
  // recovers), then each item dropped in turn, weakest first, while the rest
  // still recovers.
  template <typename MakeSet, typename Name>
  std::vector<int64_t> shrink(std::vector<int64_t> items, MakeSet make, const std::string& noun,
                              Name name) {
    size_t lo = 1, hi = items.size();
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      const std::vector<int64_t> prefix(items.begin(), items.begin() + int64_t(mid));
      if (restores(make(prefix), "the " + std::to_string(mid) + " strongest " +
                                     (mid == 1 ? noun.substr(0, noun.size() - 1) : noun)))
        hi = mid;
      else
        lo = mid + 1;
    }
    items.resize(hi);
    // Delta debugging: runs of `chunk` items dropped at once, weakest first,
    // halving the run down to single items; with an effect that only grows
    // with what is restored, the last pass leaves every item needed.
    for (size_t chunk = std::max<size_t>(1, items.size() / 2);; chunk /= 2) {
      for (size_t end = items.size(); end > 0 && items.size() > 1;) {
        const size_t begin = end > chunk ? end - chunk : 0;
        std::vector<int64_t> without = items;
        without.erase(without.begin() + int64_t(begin), without.begin() + int64_t(end));
        // "layers" -> "layer" for one
        const std::string what = without.size() == 1 ? noun.substr(0, noun.size() - 1) : noun;
        if (!without.empty() && restores(make(without), "the " + std::to_string(without.size()) +
                                                            " " + what + " kept so far without " +
                                                            run_name(items, begin, end, name)))
          items = without;
        end = begin;
      }
      if (chunk == 1) break;
    }
    return items;
  }

  // "layer 4" or "layers 4 to 9 (6)": items [begin, end) by `name`.
  template <typename Name>
  static std::string run_name(const std::vector<int64_t>& items, size_t begin, size_t end,
                              Name name) {
    if (end - begin == 1) return name(items[begin]);
    return name(items[begin]) + " and " + std::to_string(end - begin - 1) + " weaker";
  }

  std::vector<int64_t> minimal_layers() {
    std::vector<int64_t> layers;
    for (int64_t l = 0; l < q_.layers; ++l)
      for (int64_t k = 0; k < q_.kv_heads; ++k)
        if (q_.lost[size_t(l * q_.kv_heads + k)]) {
          layers.push_back(l);
          break;
        }
    layers = ranked(layers, [&](int64_t l) { return layer_score(l); });
    r_.minimal = layers_set(layers);  // a recovering set so far
    layers = shrink(
        layers, [&](const std::vector<int64_t>& ls) { return layers_set(ls); }, "layers",
        [](int64_t l) { return "layer " + std::to_string(l); });
    r_.minimal = layers_set(layers);
    return layers;
  }

  void minimal_heads(const std::vector<int64_t>& layers) {
    std::vector<int64_t> heads;
    for (int64_t l : layers)
      for (int64_t k = 0; k < q_.kv_heads; ++k)
        if (q_.lost[size_t(l * q_.kv_heads + k)]) heads.push_back(l * q_.kv_heads + k);
    heads = ranked(heads, [&](int64_t h) { return q_.head_score[size_t(h)]; });
    if (heads.size() > 1)
      heads = shrink(
          heads, [&](const std::vector<int64_t>& hs) { return heads_set(hs); }, "heads",
          [this](int64_t h) {
            return "layer " + std::to_string(h / q_.kv_heads) + " kv head " +
                   std::to_string(h % q_.kv_heads);
          });
    r_.minimal = heads_set(heads);
    r_.minimal_effect = replay(r_.minimal, {}, "the minimal set", &r_.minimal_replay);
    r_.minimal_confirmed = true;
  }

  // Each layer restored alone; each head of the set alone, and dropped from
  // the full restoration.
  void single_effects() {
    for (int64_t h = 0; h < int64_t(r_.minimal.size()); ++h)
      if (r_.minimal[size_t(h)]) {
        HeadEffect e;
        e.layer = h / q_.kv_heads;
        e.kv_head = h % q_.kv_heads;
        r_.head_effects.push_back(e);
      }
    // Layers in the ranking's order (listed by index): the budget goes to the
    // likely ones first.
    std::vector<int64_t> layers;
    for (int64_t l = 0; l < q_.layers; ++l) {
      const Set s = layers_set({l});
      if (std::any_of(s.begin(), s.end(), [](uint8_t x) { return x != 0; })) layers.push_back(l);
    }
    for (int64_t l : layers) {
      HeadEffect e;
      e.layer = l;
      r_.layer_effects.push_back(e);
    }
    // The minimal set's heads first (alone, then dropped), then the layers.
    for (HeadEffect& e : r_.head_effects) {
      e.restore = replay(
          heads_set({e.layer * q_.kv_heads + e.kv_head}), {},
          "layer " + std::to_string(e.layer) + " kv head " + std::to_string(e.kv_head) + " alone",
          &e.restore_replay);
      e.has_restore = true;
    }
    for (HeadEffect& e : r_.head_effects) {
      if (!q_.has_needle) break;
      e.drop = replay(q_.lost, heads_set({e.layer * q_.kv_heads + e.kv_head}),
                      "the full restoration without the needle in layer " +
                          std::to_string(e.layer) + " kv head " + std::to_string(e.kv_head),
                      &e.drop_replay);
      e.has_drop = true;
    }
    for (int64_t l : ranked(layers, [&](int64_t x) { return layer_score(x); })) {
      HeadEffect& e = *std::find_if(r_.layer_effects.begin(), r_.layer_effects.end(),
                                    [l](const HeadEffect& x) { return x.layer == l; });
      e.restore =
          replay(layers_set({l}), {}, "layer " + std::to_string(l) + " alone", &e.restore_replay);
      e.has_restore = true;
    }
  }

  const CausalQuery& q_;
  const ReplayEvaluator& evaluate_;
  CausalResult r_;
  std::map<std::string, int64_t> seen_;  // request -> index into replays
  Set best_;                             // the smallest recovering restoration so far
};

std::string number(double v, const char* fmt = "%.2f") {
  if (std::isnan(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string head_phrase(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    const size_t dot = names[i].find('.');
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ");
    out += "layer " + names[i].substr(0, dot) + " kv head " + names[i].substr(dot + 1);
  }
  return out;
}

}  // namespace

CausalResult causal_search(const CausalQuery& query, const ReplayEvaluator& evaluate) {
  return Search(query, evaluate).run();
}

std::vector<std::string> head_names(const std::vector<uint8_t>& set, int64_t kv_heads) {
  std::vector<std::string> out;
  for (size_t h = 0; h < set.size(); ++h)
    if (set[h])
      out.push_back(std::to_string(int64_t(h) / kv_heads) + "." +
                    std::to_string(int64_t(h) % kv_heads));
  return out;
}

bool parse_head_name(const std::string& name, int64_t* layer, int64_t* kv_head) {
  *layer = *kv_head = -1;
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return false;
  try {
    const int64_t l = std::stoll(name.substr(0, dot)), k = std::stoll(name.substr(dot + 1));
    *layer = l;
    *kv_head = k;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string format_causal(const CausalResult& r, int64_t kv_heads) {
  std::string out;
  const std::string lp0 = number(r.original.logprob), lp1 = number(r.full.logprob);
  out += "replays: " + std::to_string(r.replays.size()) + " of a budget of " +
         std::to_string(r.budget) + (r.budget_exhausted ? " (spent before the search ended)" : "") +
         "\n";
  out += "the policy's run: answer log p " + lp0 + ", success " +
         (r.original.success < 0 ? "-"
          : r.original.success   ? "yes"
                                 : "no") +
         "\n";
  out += "every loss restored: answer log p " + lp1 + ", success " +
         (r.full.success < 0 ? "-"
          : r.full.success   ? "yes"
                             : "no") +
         "\n";
  if (!r.recoverable) {
    out +=
        "restoring everything the policy took does not recover the answer: the miss is not the "
        "policy's evictions alone\n";
  } else if (!r.minimal_confirmed) {
    const std::vector<std::string> names = head_names(r.minimal, kv_heads);
    out += "the budget ran out before the set was minimal; the smallest recovering set found has " +
           std::to_string(names.size()) + " heads" +
           (names.size() <= 12 ? ": " + head_phrase(names) : std::string()) + "\n";
  } else {
    const std::vector<std::string> names = head_names(r.minimal, kv_heads);
    bool single = false;
    for (const HeadEffect& e : r.head_effects)
      single =
          single || (e.has_restore && !std::isnan(r.threshold) && e.restore.logprob >= r.threshold);
    out +=
        "restoring the policy's losses in " + head_phrase(names) + " recovers the answer: log p " +
        lp0 + " -> " + number(r.minimal_effect.logprob) +
        (names.size() > 1 ? (single ? "; a single head of them does too" : "; no single head does")
                          : "") +
        "\n";
  }
  if (!std::isnan(r.threshold)) out += "recovered means log p >= " + number(r.threshold) + "\n";
  for (const HeadEffect& e : r.head_effects)
    out += "  layer " + std::to_string(e.layer) + " kv head " + std::to_string(e.kv_head) +
           ": restored alone log p " + (e.has_restore ? number(e.restore.logprob) : "-") +
           "; dropped from the full restoration log p " +
           (e.has_drop ? number(e.drop.logprob) : "-") + "\n";
  if (!r.layer_effects.empty()) {
    out += "each layer restored alone (log p):";
    for (const HeadEffect& e : r.layer_effects)
      out +=
          " " + std::to_string(e.layer) + ":" + (e.has_restore ? number(e.restore.logprob) : "-");
    out += "\n";
  }
  return out;
}

}  // namespace kvscope::analysis
