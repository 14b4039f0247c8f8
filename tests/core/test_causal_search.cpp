// The causal search (core/analysis/causal_search.h) against planted
// evaluations whose answer provably depends on known heads: it finds
// exactly those within its budget, says when no single head does, finds no
// small set where the effect is spread over every head, and says when
// restoring everything does not recover the answer.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>

#include "core/analysis/causal_search.h"

using namespace kvscope::analysis;

namespace {

constexpr int64_t kL = 6, kK = 3;

int64_t head(int64_t l, int64_t k) {
  return l * kK + k;
}

// Every head lost something; decoys rank above the planted heads.
CausalQuery query(int64_t budget = 40) {
  CausalQuery q;
  q.layers = kL;
  q.kv_heads = kK;
  q.head_score.assign(kL * kK, 1.0);
  q.lost.assign(kL * kK, 1);
  q.head_score[head(0, 0)] = 9;  // decoys: lost the most, matter not at all
  q.head_score[head(1, 2)] = 8;
  q.head_score[head(5, 1)] = 7;
  q.original = {-10.0, 400, 0, 0.0};
  q.budget = budget;
  return q;
}

// log p -10, +4.5 per planted head restored: both are needed to pass -1.9.
ReplayEffect planted(const ReplayRequest& r, std::vector<int64_t> heads, double each) {
  ReplayEffect e;
  e.logprob = -10;
  for (int64_t h : heads)
    if (r.restore[size_t(h)] && (r.drop.empty() || !r.drop[size_t(h)])) e.logprob += each;
  e.success = e.logprob > -2 ? 1 : 0;
  e.score = e.success;
  e.rank = e.success ? 1 : 50;
  return e;
}

}  // namespace

TEST_CASE("causal search: two planted heads that are needed together are found exactly",
          "[causal]") {
  const std::vector<int64_t> want = {head(2, 1), head(4, 0)};
  int64_t calls = 0;
  const CausalResult r = causal_search(query(), [&](const ReplayRequest& q) {
    ++calls;
    return planted(q, want, 4.5);
  });
  REQUIRE(r.recoverable);
  CHECK(r.full.logprob == Approx(-1.0));
  CHECK(r.threshold == Approx(-1.9));
  REQUIRE(r.minimal_confirmed);
  CHECK(head_names(r.minimal, kK) == std::vector<std::string>{"2.1", "4.0"});
  CHECK(r.minimal_effect.logprob == Approx(-1.0));
  CHECK(int64_t(r.replays.size()) == calls);
  CHECK(calls <= 40);
  CHECK_FALSE(r.budget_exhausted);
  // Each planted head alone does not recover; dropping either from the full
  // restoration loses it.
  REQUIRE(r.head_effects.size() == 2);
  for (const HeadEffect& e : r.head_effects) {
    CHECK(e.restore.logprob == Approx(-5.5));
    CHECK(e.drop.logprob == Approx(-5.5));
  }
  const std::string words = format_causal(r, kK);
  CHECK_THAT(words, Catch::Contains("layer 2 kv head 1 and layer 4 kv head 0 recovers the answer"));
  CHECK_THAT(words, Catch::Contains("no single head does"));
}

TEST_CASE("causal search: one planted head is found alone", "[causal]") {
  const CausalResult r =
      causal_search(query(), [](const ReplayRequest& q) { return planted(q, {head(3, 2)}, 9.0); });
  REQUIRE(r.minimal_confirmed);
  CHECK(head_names(r.minimal, kK) == std::vector<std::string>{"3.2"});
  // Every layer's single effect is measured: only layer 3 recovers.
  REQUIRE(r.layer_effects.size() == kL);
  for (const HeadEffect& e : r.layer_effects)
    CHECK((e.restore.logprob > r.threshold) == (e.layer == 3));
}

TEST_CASE("causal search: a control with the effect spread over every head finds no small set",
          "[causal]") {
  std::vector<int64_t> all;
  for (int64_t h = 0; h < kL * kK; ++h) all.push_back(h);
  const CausalResult r = causal_search(
      query(200), [&](const ReplayRequest& q) { return planted(q, all, 9.0 / double(kL * kK)); });
  REQUIRE(r.recoverable);
  REQUIRE(r.minimal_confirmed);
  // -10 + 0.5 per head passes -1.9 from 17 heads on.
  CHECK(head_names(r.minimal, kK).size() == 17);
}

TEST_CASE("causal search: when restoring everything does not help, it says so", "[causal]") {
  const CausalResult r = causal_search(query(), [](const ReplayRequest&) {
    ReplayEffect e;
    e.logprob = -10.02;
    e.success = 0;
    e.score = 0;
    return e;
  });
  CHECK_FALSE(r.recoverable);
  CHECK(std::none_of(r.minimal.begin(), r.minimal.end(), [](uint8_t x) { return x != 0; }));
  CHECK_THAT(format_causal(r, kK), Catch::Contains("does not recover the answer"));
}

TEST_CASE("causal search: the budget bounds the replays and is reported", "[causal]") {
  int64_t calls = 0;
  const CausalResult r = causal_search(query(3), [&](const ReplayRequest& q) {
    ++calls;
    return planted(q, {head(2, 1), head(4, 0)}, 4.5);
  });
  CHECK(calls == 3);
  CHECK(r.budget_exhausted);
  CHECK_FALSE(r.minimal_confirmed);
  CHECK_THAT(format_causal(r, kK), Catch::Contains("budget ran out"));
  CausalQuery bad = query(0);
  CHECK_THROWS_AS(causal_search(bad, [](const ReplayRequest&) { return ReplayEffect{}; }),
                  std::invalid_argument);
}

TEST_CASE("causal search: heads that lost nothing are never restored", "[causal]") {
  CausalQuery q = query();
  std::fill(q.lost.begin(), q.lost.end(), 0);
  q.lost[head(2, 1)] = q.lost[head(4, 0)] = q.lost[head(0, 0)] = 1;
  const CausalResult r = causal_search(q, [](const ReplayRequest& rq) {
    for (size_t h = 0; h < rq.restore.size(); ++h)
      if (rq.restore[h]) REQUIRE((h == size_t(head(2, 1)) || h == size_t(head(4, 0)) || h == 0));
    return planted(rq, {head(2, 1), head(4, 0)}, 4.5);
  });
  CHECK(head_names(r.minimal, kK) == std::vector<std::string>{"2.1", "4.0"});
}
