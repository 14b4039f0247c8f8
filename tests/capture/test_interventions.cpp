// A replay's interventions (capture/policy/interventions.h) on the step
// driver: what a restore keeps leaves the policy's view but stays attended,
// in the kept tier, outside the policy's budget; a pin keeps chosen tokens;
// a drop takes tokens from chosen heads; only lets the policy act in chosen
// heads; every changed decision is an /interventions row; and bad specs are
// refused naming the part and the range.
#include "tests/capture/capture_test_util.h"

#include "capture/attention/step_driver.h"
#include "capture/policy/interventions.h"
#include "capture/policy/registry.h"
#include "core/common/input_error.h"

using namespace kvscope;

namespace {

const int64_t kM = 128, kPage = 16;

policy::InterventionShape shape_of(const model::ModelConfig& c) {
  policy::InterventionShape s;
  s.layers = c.n_layers;
  s.kv_heads = c.n_kv_heads;
  s.tokens = kM;
  s.steps = 64;
  s.needle = {10, 11, 12};
  return s;
}

// streaming_llm (2 sinks, a window of 8) over a 32-token prompt in 4 chunks,
// then decode steps, under the interventions given.
struct Replay {
  model::ModelConfig c = test::small_config();
  policy::PolicyInstance pi = policy::make_policy("streaming_llm:sinks=2,window=8");
  std::unique_ptr<policy::Interventions> iv;
  std::unique_ptr<policy::StepDriver> driver;
  std::vector<trace::Event> events;
  std::vector<trace::InterventionRow> rows;
  explicit Replay(const std::vector<std::string>& specs) {
    std::vector<policy::Intervention> list;
    for (const std::string& s : specs) list.push_back(policy::parse_intervention(s, shape_of(c)));
    iv = std::make_unique<policy::Interventions>(list, c.n_layers, c.n_kv_heads);
    pi.policy->setup({&c, kM, 32, kPage});
    policy::StepDriver::Options o{kPage, kM, 32};
    o.interventions = iv.get();
    driver = std::make_unique<policy::StepDriver>(c, o, *pi.policy, "streaming_llm");
    for (int64_t p = 0; p < 32; p += 8) step(p, 8);
    for (int64_t p = 32; p < 40; ++p) step(p, 1);
  }
  void step(int64_t pos0, int64_t n) {
    driver->begin_step(pos0, n);
    for (int64_t l = 0; l < c.n_layers; ++l)
      driver->attend(test::random_inputs(c, l, pos0, n, uint64_t(pos0 + 1)));
    driver->end_step();
    for (auto& e : driver->take_events()) events.push_back(e);
    for (auto& r : driver->take_interventions()) rows.push_back(r);
  }
  const cache::RaggedKvCache& cache() const { return driver->cache(); }
};

}  // namespace

TEST_CASE("restore: what the policy evicts in the chosen heads stays, attended, out of its view",
          "[interventions]") {
  Replay r({"restore:heads=1.0"});
  const cache::RaggedKvCache& cache = r.cache();
  REQUIRE(r.driver->kept_tier() == 1);
  REQUIRE(cache.tiers()[1].name == "kept");
  REQUIRE(cache.tiers()[1].attended);
  // Layer 1 kv head 0 holds all 40 positions: 10 in the policy's tier, 30 kept.
  CHECK(cache.count(1, 0, 0) == 10);
  CHECK(cache.count(1, 0, 1) == 30);
  CHECK(cache.attended_count(1, 0) == 40);
  // The other heads are the policy's own: sinks + window.
  CHECK(cache.count(1, 1) == 10);
  CHECK(cache.count(0, 0) == 10);
  // Each kept entry is a demote to the kept tier with the intervention's
  // reason, and an /interventions row naming the policy's evict.
  int64_t kept = 0;
  for (const trace::Event& e : r.events)
    if (e.to_tier == 1) {
      ++kept;
      CHECK(e.kind == trace::EventKind::Demote);
      CHECK(e.reason == r.pi.policy->reason_names().size());
      CHECK(e.layer == 1);
      CHECK(e.kv_head == 0);
    }
  CHECK(kept == 30);
  REQUIRE(r.rows.size() == 30);
  for (const trace::InterventionRow& row : r.rows) {
    CHECK(row.action == trace::InterventionAction::Kept);
    CHECK(row.decision == trace::EventKind::Evict);
    CHECK(row.reason == 1);  // streaming_llm's "outside sinks and window"
  }
}

TEST_CASE("restore from a step keeps only the losses from that step on", "[interventions]") {
  Replay r({"restore:all,from=4"});  // step 4 is the first decode step
  const cache::RaggedKvCache& cache = r.cache();
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 2; ++h) {
      CHECK(cache.count(l, h, 0) == 10);
      CHECK(cache.count(l, h, 1) == 8);  // the 8 decode steps' evictions
    }
  for (const trace::InterventionRow& row : r.rows) CHECK(row.step >= 4);
}

TEST_CASE("pin keeps the chosen tokens wherever the policy would take them", "[interventions]") {
  Replay r({"pin:tokens=needle"});
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 2; ++h) {
      CHECK(r.cache().count(l, h, 1) == 3);
      for (int64_t t : {10, 11, 12}) CHECK(r.cache().tier_of(l, h, t) == 1);
      CHECK(r.cache().count(l, h, 0) == 10);
    }
}

TEST_CASE("drop takes the chosen tokens from the chosen heads, the policy's later decisions moot",
          "[interventions]") {
  Replay r({"drop:tokens=35-37,heads=0.1"});
  REQUIRE(r.driver->kept_tier() == -1);  // nothing to keep: no kept tier
  CHECK(r.cache().n_tiers() == 1);
  for (int64_t t : {35, 36, 37}) {
    CHECK_FALSE(r.cache().holds(0, 1, t));
    CHECK(r.cache().holds(0, 0, t));
    CHECK(r.cache().holds(1, 1, t));
  }
  CHECK(r.cache().count(0, 1) == 7);
  REQUIRE(r.rows.size() == 3);
  for (const trace::InterventionRow& row : r.rows) {
    CHECK(row.action == trace::InterventionAction::Dropped);
    CHECK(row.layer == 0);
    CHECK(row.kv_head == 1);
  }
}

TEST_CASE("only: the policy acts in the chosen heads, the others keep everything",
          "[interventions]") {
  Replay r({"only:layers=0"});
  CHECK(r.cache().attended_count(0, 0) == 10);
  CHECK(r.cache().attended_count(0, 1) == 10);
  CHECK(r.cache().attended_count(1, 0) == 40);
  CHECK(r.cache().attended_count(1, 1) == 40);
}

TEST_CASE("no intervention: the driver's decisions are the policy's own", "[interventions]") {
  Replay with({}), kept({"pin:tokens=needle,heads=1.1"});
  // With an empty list nothing changes: no kept tier, no rows.
  CHECK(with.driver->kept_tier() == -1);
  CHECK(with.rows.empty());
  CHECK(with.cache().count(1, 1) == 10);
  CHECK(kept.cache().count(1, 1) == 13);
}

TEST_CASE("a bad intervention is refused naming the part and the range", "[interventions]") {
  const policy::InterventionShape s = shape_of(test::small_config());
  auto refused = [&](const std::string& spec, const std::string& words) {
    try {
      policy::parse_intervention(spec, s);
      FAIL("accepted " << spec);
    } catch (const InputError& e) {
      CHECK(e.field() == "--intervene");
      CHECK_THAT(e.what(), Catch::Contains(words));
    }
  };
  refused("restore:heads=2.0", "2 layers (0-1) of 2 kv heads (0-1)");
  refused("restore:heads=1.2", "2 layers (0-1) of 2 kv heads (0-1)");
  refused("restore:layers=0-5", "'0-5'");
  refused("pin:tokens=200", "tokens 0-127");
  refused("pin:tokens=question", "marks no question tokens");
  refused("drop:heads=0.0", "names no tokens");
  refused("restore:from=3", "names no heads");
  refused("restore:all,from=99", "steps 0-63");
  refused("keep:all", "expected restore:, pin:, drop: or only:");
  refused("restore:all,at=2", "'at': not a part of restore:");
  refused("restore:heads=x", "expected L.H");
  refused("restore:", "needs its parts");
}

TEST_CASE("intervention lists continue over commas and print back", "[interventions]") {
  const policy::InterventionShape s = shape_of(test::small_config());
  const policy::Intervention iv = policy::parse_intervention("restore:heads=1.0,0.1,from=2", s);
  CHECK(iv.n_heads() == 2);
  CHECK(iv.from_step == 2);
  CHECK(policy::head_list_text(iv.heads, 2) == "0.1,1.0");
  CHECK(policy::head_list_text(policy::parse_intervention("only:layers=1", s).heads, 2) == "1");
  CHECK(policy::head_list_text(policy::parse_intervention("restore:all", s).heads, 2) == "all");
}
