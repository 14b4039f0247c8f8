// The Deferred Retention Rate on small traces written through the real
// TraceWriter, whose answer is worked out by hand: evicted before the needed
// steps counts 0, held counts 1, evicted after attention at a needed step
// still counts for that step, a non-attended tier counts as unavailable
// unless a promotion at the step brings the token back, and the tier's
// attended flag decides.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/analysis/deferred_retention.h"
#include "core/trace/reader.h"
#include "core/trace/writer.h"
#include "tests/support/paths.h"

using namespace kvscope;
using trace::EventKind;
using trace::TokenRole;

namespace {

// Tokens 0..5 are fed by the prefill (step 0), then one per decode step:
// token 5 + s at step s. In kDefer, 2 and 3 are the needle, 6 and 7 forced
// distractors (steps 1, 2), 8 and 9 the question (steps 3, 4), 10 and 11
// generated (steps 5, 6): the needed steps are 3..6.
const std::vector<TokenRole> kDefer = {
    TokenRole::Template, TokenRole::Prompt,   TokenRole::Needle,    TokenRole::Needle,
    TokenRole::Prompt,   TokenRole::Prompt,   TokenRole::Prompt,    TokenRole::Prompt,
    TokenRole::Question, TokenRole::Question, TokenRole::Generated, TokenRole::Generated};
constexpr int kSteps = 7, kLayers = 2, kKvHeads = 2;

struct Move {
  int step, layer, kv_head, token;
  EventKind kind;
  int to_tier;  // ignored for Evict
};

// Every head admits every token into tier 0 when it is fed, then `moves`.
std::string write_trace(const std::string& name, const std::vector<TokenRole>& roles,
                        const std::vector<std::string>& tiers, const std::vector<uint8_t>& attended,
                        const std::vector<Move>& moves) {
  trace::RunInfo run;
  run.model.name = "drr-test";
  run.model.architecture = "llama";
  run.model.n_layers = kLayers;
  run.model.n_heads = 2 * kKvHeads;
  run.model.n_kv_heads = kKvHeads;
  run.model.head_dim = 4;
  run.model.vocab_size = 64;
  run.model.context_length = 64;
  run.policy = run.policy_name = "by-hand";
  run.tier_names = tiers;
  run.tier_attended = attended;
  trace::CaptureLayout layout;
  layout.max_tokens = int64_t(roles.size());
  const std::string path = test::temp_dir() + "/" + name + ".kvtrace.h5";
  auto w = trace::TraceWriter::create(path, run, layout);
  const int R = int(tiers.size());
  std::map<std::pair<int, int>, int> where;  // (layer * K + kv head, token) -> tier
  for (int s = 0; s < kSteps; ++s) {
    trace::StepData sd;
    sd.step.kind = s == 0 ? trace::StepKind::Prefill : trace::StepKind::Decode;
    const int first = s == 0 ? 0 : 5 + s, n = s == 0 ? 6 : 1;
    sd.step.first_token = first;
    sd.step.n_tokens = n;
    for (int t = first; t < first + n; ++t) {
      trace::TokenRecord tr;
      tr.id = 10 + t;
      tr.position = t;
      tr.role = roles[size_t(t)];
      tr.step = s;
      tr.text = "w";
      sd.tokens.push_back(tr);
      for (int slot = 0; slot < kLayers * kKvHeads; ++slot) {
        trace::Event e;
        e.step = s;
        e.layer = int16_t(slot / kKvHeads);
        e.kv_head = int16_t(slot % kKvHeads);
        e.token = t;
        e.kind = EventKind::Admit;
        e.to_tier = 0;
        sd.events.push_back(e);
        where[{slot, t}] = 0;
      }
    }
    for (const Move& m : moves) {
      if (m.step != s) continue;
      const int slot = m.layer * kKvHeads + m.kv_head;
      trace::Event e;
      e.step = s;
      e.layer = int16_t(m.layer);
      e.kv_head = int16_t(m.kv_head);
      e.token = m.token;
      e.kind = m.kind;
      e.from_tier = uint8_t(where.at({slot, m.token}));
      if (m.kind == EventKind::Evict) {
        e.to_tier = trace::kNoTier;
        where.erase({slot, m.token});
      } else {
        e.to_tier = uint8_t(m.to_tier);
        where[{slot, m.token}] = m.to_tier;
      }
      sd.events.push_back(e);
    }
    sd.occupancy.assign(size_t(kLayers * kKvHeads * R), 0);
    for (const auto& entry : where) ++sd.occupancy[size_t(entry.first.first * R + entry.second)];
    sd.tier_bytes.assign(size_t(R), 0);
    sd.step.entries = int64_t(where.size());
    w->append_step(sd);
  }
  w->close({});
  return path;
}

analysis::DeferredRetention drr(const std::string& path) {
  auto r = trace::TraceReader::open(path);
  std::optional<analysis::DeferredRetention> d = analysis::deferred_retention(*r);
  REQUIRE(d);
  return *d;
}

}  // namespace

TEST_CASE("DRR of a single-tier trace: evicted before the need 0, held 1, evicted during it partly",
          "[drr]") {
  const analysis::DeferredRetention d =
      drr(write_trace("one-tier", kDefer, {"hot"}, {1},
                      {{1, 0, 1, 2, EventKind::Evict, 0},     // before the needed steps
                       {4, 0, 1, 3, EventKind::Evict, 0},     // after attention at step 4
                       {3, 1, 1, 2, EventKind::Evict, 0}}));  // after attention at step 3
  // Available steps of (token 2, token 3) out of 4: head (0,0) 4, 4; (0,1) 0, 2;
  // (1,0) 4, 4; (1,1) 1, 4.
  CHECK(d.needle_tokens == 2);
  CHECK(d.question_begin == 8);
  CHECK(d.first_needed_step == 3);
  CHECK(d.needed_steps == 4);
  CHECK(d.checks == 32);
  CHECK(d.available == 23);
  CHECK(d.rate == Approx(23.0 / 32.0));
  REQUIRE(d.layer_rate.size() == 2);
  CHECK(d.layer_rate[0] == Approx(10.0 / 16.0));
  CHECK(d.layer_rate[1] == Approx(13.0 / 16.0));
  CHECK(d.pairs == 8);
  CHECK(d.pairs_always == 5);
  CHECK(d.always_share == Approx(5.0 / 8.0));
  CHECK(d.promoted == 0);
}

TEST_CASE("DRR with an offloaded tier: unavailable there unless promoted at the step", "[drr]") {
  const std::vector<Move> moves = {
      // head (0,0): token 2 offloaded at step 1, promoted back at step 5;
      // token 3 offloaded after attention at step 4.
      {1, 0, 0, 2, EventKind::Demote, 1},
      {5, 0, 0, 2, EventKind::Promote, 0},
      {4, 0, 0, 3, EventKind::Demote, 1},
      // head (1,0): token 2 offloaded, then evicted from the cold tier.
      {1, 1, 0, 2, EventKind::Demote, 1},
      {2, 1, 0, 2, EventKind::Evict, 0},
      // head (1,1): token 2 offloaded in the prefill, promoted at step 3,
      // offloaded again at step 4.
      {0, 1, 1, 2, EventKind::Demote, 1},
      {3, 1, 1, 2, EventKind::Promote, 0},
      {4, 1, 1, 2, EventKind::Demote, 1},
  };
  SECTION("cold not attended") {
    const analysis::DeferredRetention d =
        drr(write_trace("offloaded", kDefer, {"hot", "cold"}, {1, 0}, moves));
    // (0,0): 2 (steps 5 by promotion, 6), 2 (steps 3, 4); (0,1): 4, 4;
    // (1,0): 0, 4; (1,1): 2 (step 3 by promotion, 4), 4.
    CHECK(d.checks == 32);
    CHECK(d.available == 22);
    CHECK(d.promoted == 2);
    CHECK(d.layer_rate[0] == Approx(12.0 / 16.0));
    CHECK(d.layer_rate[1] == Approx(10.0 / 16.0));
    CHECK(d.pairs_always == 4);
  }
  SECTION("cold attended: only the eviction loses the token") {
    const analysis::DeferredRetention d =
        drr(write_trace("attended-cold", kDefer, {"hot", "cold"}, {1, 1}, moves));
    CHECK(d.available == 28);
    CHECK(d.promoted == 0);  // the promotions moved tokens that were readable anyway
    CHECK(d.pairs_always == 7);
  }
}

TEST_CASE("DRR of a needle-style trace: the prefill that feeds the question and the needle counts",
          "[drr]") {
  // The question is the end of the prompt (tokens 4, 5): the needed steps are
  // the prefill and every decode step. Head (0,0) evicts token 2 after the
  // prefill's attention: it was available at step 0 only.
  std::vector<TokenRole> roles(12, TokenRole::Generated);
  roles[0] = TokenRole::Template;
  roles[1] = TokenRole::Prompt;
  roles[2] = roles[3] = TokenRole::Needle;
  roles[4] = roles[5] = TokenRole::Question;
  const analysis::DeferredRetention d =
      drr(write_trace("needle", roles, {"hot"}, {1}, {{0, 0, 0, 2, EventKind::Evict, 0}}));
  CHECK(d.first_needed_step == 0);
  CHECK(d.needed_steps == 7);
  CHECK(d.checks == 2 * 4 * 7);
  CHECK(d.available == 2 * 4 * 7 - 6);
  CHECK(d.pairs_always == 7);
}

TEST_CASE("no DRR without needle tokens or without a question", "[drr]") {
  std::vector<TokenRole> no_question = kDefer;
  no_question[8] = no_question[9] = TokenRole::Prompt;
  std::vector<TokenRole> no_needle = kDefer;
  no_needle[2] = no_needle[3] = TokenRole::Prompt;
  for (const auto& roles : {no_question, no_needle}) {
    auto r = trace::TraceReader::open(write_trace("none", roles, {"hot"}, {1}, {}));
    CHECK_FALSE(analysis::deferred_retention(*r).has_value());
  }
}
