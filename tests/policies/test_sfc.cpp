// The Salience Forecasting Cache (capture/policy/policies/sfc.*): the
// head-budget allocator, the cold-tier link model, and a scripted run on
// stories260K in which the forecasts are set by the test: a demotion, a
// warm -> hot promotion, a prefetch the link hides and a reactive stall.
#include "capture/policy/policies/sfc.h"

#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "capture/gates/gate_set.h"
#include "capture/tiering/hot_budget.h"
#include "capture/tiering/transfer_link.h"
#include "core/trace/reader.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;

TEST_CASE("the volatility allocator sums to the budget and keeps every floor", "[sfc]") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t heads = 1 + rng() % 9;
    std::vector<double> vol(heads);
    std::vector<int64_t> floor(heads);
    for (size_t h = 0; h < heads; ++h) {
      vol[h] = (rng() % 4 == 0) ? 0.0 : std::uniform_real_distribution<double>(0, 2)(rng);
      floor[h] = int64_t(rng() % 20);
    }
    const int64_t floors = std::accumulate(floor.begin(), floor.end(), int64_t(0));
    const int64_t budget = floors + int64_t(rng() % 500);
    const std::vector<int64_t> got = tiering::allocate_by_volatility(budget, vol, floor);
    REQUIRE(std::accumulate(got.begin(), got.end(), int64_t(0)) == budget);
    double total = 0;
    for (double v : vol) total += v;
    for (size_t h = 0; h < heads; ++h) {
      REQUIRE(got[h] >= floor[h]);
      // Within one entry of the exact proportional share.
      const double share = total > 0 ? double(budget - floors) * vol[h] / total
                                     : double(budget - floors) / double(heads);
      REQUIRE(std::fabs(double(got[h] - floor[h]) - share) < 1.0 + 1e-9);
    }
  }
  CHECK(tiering::allocate_by_volatility(10, {1.0, 3.0}, {0, 0}) == std::vector<int64_t>{3, 7});
  CHECK_THROWS_AS(tiering::allocate_by_volatility(3, {1.0, 1.0}, {2, 2}), std::invalid_argument);
}

TEST_CASE("the cold-tier link: prefetches land after their copy, reactive fetches wait", "[sfc]") {
  tiering::TransferLink link({25.0, 10.0, 1000.0});  // 25 GB/s, 10 us, 1 ms steps
  const double row = link.copy_seconds(512);
  CHECK(row == Approx(10e-6 + 512 / 25e9));
  // A small prefetch issued by the first layer of step 3 is there for step 4's.
  CHECK(link.prefetch(3, 0.0, 512) == 4);
  // 75 MB take 3 ms: issued by the middle layer of step 5 (t = 5.5 ms) it
  // ends at 8.51 ms, after step 8's middle layer (8.5 ms): step 9.
  CHECK(link.prefetch(5, 0.5, 75'000'000) == 9);
  // A reactive fetch at step 7's first layer (7 ms) queues behind it.
  const double wait = link.fetch_now(7, 0.0, 512);
  CHECK(wait == Approx(8.51e-3 + row - 7e-3).epsilon(1e-9));
  CHECK(link.stalled_seconds() == Approx(wait));
  CHECK(link.step_start(8) == Approx(8e-3 + wait));  // the stall delays every later step
  // On an idle link the wait is the copy itself.
  CHECK(link.fetch_now(20, 0.25, 512) == Approx(row));
}

namespace {

// The forecasts of head (0, 0) are scripted: (from step, position) -> (now,
// horizon), holding until a later entry; everything else forecasts 0.
class ScriptedSfc : public policy::sfc::SfcPolicy {
 public:
  using Script = std::map<std::pair<int64_t, int64_t>, std::pair<float, float>>;
  ScriptedSfc(policy::sfc::SfcSpec spec, Script script)
      : SfcPolicy(std::move(spec)), script_(std::move(script)) {}

 protected:
  void predict(const policy::AdmitContext& c, torch::Tensor p_now, torch::Tensor p_hor) override {
    p_now.zero_();
    p_hor.zero_();
    if (c.layer != 0) return;
    for (const auto& [key, value] : script_)  // later entries of a token override earlier
      if (key.first <= c.step && key.second < p_now.size(1)) {
        p_now[0][key.second] = value.first;
        p_hor[0][key.second] = value.second;
      }
  }

 private:
  Script script_;
};

struct Move {
  int kind;
  int32_t step, token;
  uint8_t from, to;
  uint16_t reason;
};

std::vector<Move> head00_moves(const std::vector<trace::Event>& events) {
  std::vector<Move> out;
  for (const trace::Event& e : events)
    if (e.layer == 0 && e.kv_head == 0 &&
        (e.kind == trace::EventKind::Promote || e.kind == trace::EventKind::Demote))
      out.push_back({int(e.kind), e.step, e.token, e.from_tier, e.to_tier, e.reason});
  return out;
}

bool has(const std::vector<Move>& moves, trace::EventKind kind, int32_t token, uint16_t reason) {
  for (const Move& m : moves)
    if (m.kind == int(kind) && m.token == token && m.reason == reason) return true;
  return false;
}

}  // namespace

TEST_CASE("sfc, scripted: demotion, warm -> hot, a hidden prefetch and a reactive stall", "[sfc]") {
  namespace s = policy::sfc;
  auto model = test::load_stories();
  std::vector<int64_t> prompt = test::story_prompt_ids();
  prompt.resize(40);
  s::SfcSpec spec;
  spec.sinks = 2, spec.window = 4, spec.hot = 0.25, spec.warm = 0.25;
  // Step 0 (the prefill): every token is new and counts as certain, so the
  // oldest non-pinned ones take the hot room: 2, 3, 4, 5 (hot budget 10 =
  // 0.25 * 40, 6 pinned); 6..15 go warm (budget 10), 16..35 cold.
  ScriptedSfc::Script script = {
      {{1, 2}, {0.0f, 0.1f}},   // step 1: token 2 falls below down -> warm
      {{2, 7}, {0.0f, 0.9f}},   // step 2: warm token 7 crosses up -> hot
      {{2, 20}, {0.0f, 0.9f}},  // step 2: cold token 20 forecast within H: prefetch
      {{4, 30}, {0.9f, 0.9f}},  // step 4: cold token 30 needed now: reactive fetch
  };
  test::PolicyRun run(*model, std::make_unique<ScriptedSfc>(spec, script), "sfc", 64, 40);
  std::vector<std::vector<Move>> moves;
  std::vector<std::vector<trace::StallRow>> stalls;
  run.generate(*model, prompt, 5, [&](int64_t) {
    moves.push_back(head00_moves(run.last_events()));
    stalls.push_back(run.last_stalls());
  });
  const cache::RaggedKvCache& c = run.cache();
  REQUIRE(moves.size() == 6);

  // After the prefill: 10 hot, 10 warm, 20 cold; the pinned sinks and window hot.
  // (Checked on the last step's state below; here the prefill's moves.)
  CHECK(has(moves[0], trace::EventKind::Demote, 6, s::kHotDown));
  CHECK(has(moves[0], trace::EventKind::Demote, 16, s::kColdDown));
  CHECK_FALSE(has(moves[0], trace::EventKind::Demote, 2, s::kHotDown));

  CHECK(has(moves[1], trace::EventKind::Demote, 2, s::kHotDown));  // 0.1 < down
  CHECK(has(moves[2], trace::EventKind::Promote, 7, s::kWarmUp));  // 0.9 >= up, from warm
  // The prefetch issued after step 2's attention lands before step 3's: no stall.
  CHECK(has(moves[3], trace::EventKind::Promote, 20, s::kLanded));
  CHECK(stalls[3].empty());
  CHECK(c.tier_of(0, 0, 20) == s::kHot);
  // Step 4: token 30 is fetched before the attention, the step waits for one row.
  REQUIRE(stalls[4].size() == 1);
  CHECK(stalls[4][0].token == 30);
  CHECK(stalls[4][0].layer == 0);
  CHECK(stalls[4][0].kv_head == 0);
  CHECK(stalls[4][0].wait_s == Approx(10e-6 + 2 * 8 * 4 / 25e9));
  CHECK(has(moves[4], trace::EventKind::Promote, 30, s::kReactive));
  // No other head stalled (their forecasts are all 0) and nothing was evicted.
  for (const auto& st : stalls)
    for (const trace::StallRow& r : st) CHECK((r.layer == 0 && r.kv_head == 0 && r.token == 30));
  for (int64_t l = 0; l < c.n_layers(); ++l)
    for (int64_t h = 0; h < c.n_kv_heads(); ++h) REQUIRE(c.count(l, h) == 45);
  // Sinks and window are hot at the end.
  for (int64_t pos : {0, 1, 41, 42, 43, 44}) CHECK(c.tier_of(1, 2, pos) == s::kHot);
  CHECK(c.count(1, 2, s::kHot) <= int64_t(std::llround(0.25 * 45)));
}

namespace {

// A forecaster with the initial (untrained) weights, saved for `config`'s shapes.
std::string random_forecaster(const gates::GateShape& shape, const std::string& dir,
                              uint64_t seed) {
  const std::string path = dir + "/sfc-" + std::to_string(seed) + ".safetensors";
  gates::save_gates(gates::init_gates(gates::GateKind::SfcGru,
                                      gates::resolve_hyperparameters(gates::GateKind::SfcGru, shape,
                                                                     nullptr, "--gate"),
                                      shape, seed),
                    path);
  return path;
}

using Interval = std::tuple<int32_t, uint8_t, int32_t, int32_t>;  // token, tier, begin, end

// The tier intervals of one head replayed from the events (zero-length ones,
// a token that moved twice in one step, left out on both sides).
std::vector<Interval> intervals_from_events(const std::vector<trace::Event>& events, int layer,
                                            int kv_head) {
  std::map<int32_t, std::pair<uint8_t, int32_t>> open;  // token -> (tier, since)
  std::vector<Interval> out;
  auto close = [&](int32_t token, int32_t step) {
    auto it = open.find(token);
    if (it == open.end()) return;
    if (step > it->second.second) out.push_back({token, it->second.first, it->second.second, step});
    open.erase(it);
  };
  for (const trace::Event& e : events) {
    if (e.layer != layer || e.kv_head != kv_head || e.kind == trace::EventKind::Select) continue;
    close(e.token, e.step);
    if (e.to_tier != trace::kNoTier) open[e.token] = {e.to_tier, e.step};
  }
  for (const auto& [token, o] : open) out.push_back({token, o.first, o.second, -1});
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("sfc captures a valid, deterministic trace whose tier intervals agree with its events",
          "[sfc][capture]") {
  const std::string dir = test::temp_dir();
  auto model = test::load_stories();
  const std::string gates = random_forecaster(gates::GateShape::of(model->config()), dir, 3);
  const std::string run = test::kvscope_exe() + " capture --model " + test::shared_dir() +
                          "/models/stories260K/stories260K.bin --tokenizer " + test::shared_dir() +
                          "/models/stories260K/tok512.bin --prompt 'Once upon a time, there was "
                          "a little girl named Lily. She loved to play outside in the park.' "
                          "--max-new 40 -q --capture received --oracle --policy "
                          "sfc:gates=" +
                          gates + ",hot=0.3,window=4,sinks=2,now=0.3 -o ";
  std::string out;
  REQUIRE(test::run_command(run + dir + "/a.kvtrace.h5", &out) == 0);
  REQUIRE(test::run_command(run + dir + "/b.kvtrace.h5", &out) == 0);
  REQUIRE(test::run_command(test::kvscope_exe() + " info --check " + dir + "/a.kvtrace.h5", &out) ==
          0);
  auto a = trace::TraceReader::open(dir + "/a.kvtrace.h5");
  auto b = trace::TraceReader::open(dir + "/b.kvtrace.h5");
  CHECK(a->run().tier_names == std::vector<std::string>{"hot", "warm", "cold"});
  CHECK(a->tier_attended() == std::vector<uint8_t>{1, 1, 0});
  const std::vector<trace::Event> ea = a->events(0, a->n_events()),
                                  eb = b->events(0, b->n_events());
  REQUIRE(ea.size() == eb.size());
  int64_t moves = 0, evictions = 0;
  for (size_t i = 0; i < ea.size(); ++i) {
    REQUIRE(std::memcmp(&ea[i], &eb[i], sizeof(trace::Event)) == 0);  // same run, same trace
    moves += ea[i].kind == trace::EventKind::Promote || ea[i].kind == trace::EventKind::Demote;
    evictions += ea[i].kind == trace::EventKind::Evict;
  }
  CHECK(moves > 0);
  CHECK(evictions == 0);  // the SFC never evicts
  for (int l = 0; l < int(a->n_layers()); ++l)
    for (int h = 0; h < int(a->n_kv_heads()); ++h) {
      std::vector<Interval> got;
      for (const trace::TierInterval& t : a->intervals(l, h))
        if (t.end_step != t.begin_step) got.push_back({t.token, t.tier, t.begin_step, t.end_step});
      std::sort(got.begin(), got.end());
      const std::vector<Interval> want = intervals_from_events(ea, l, h);
      INFO("layer " << l << ", kv head " << h << ": " << got.size() << " intervals in the trace, "
                    << want.size() << " replayed from the events");
      const bool same = got == want;
      REQUIRE(same);
    }
  // Stalls (the untrained forecaster's now-logit fires for some cold tokens)
  // carry the oracle's verdict and the modelled wait of at least one copy.
  const std::vector<trace::StallRow> stalls = a->stalls();
  for (const trace::StallRow& s : stalls) {
    CHECK((s.needed == 0 || s.needed == 1));
    CHECK(s.wait_s >= 10e-6f);
  }
}

TEST_CASE(
    "sfc refuses tiers that cannot hold the window, bad thresholds and another model's "
    "forecaster (exit 2 naming the field)",
    "[sfc][capture]") {
  const std::string dir = test::temp_dir();
  auto model = test::load_stories();
  const std::string own = random_forecaster(gates::GateShape::of(model->config()), dir, 1);
  const std::string other = random_forecaster({30, 3, 64, 576}, dir, 2);  // SmolLM2's shapes
  const std::string run = test::kvscope_exe() + " capture --model " + test::shared_dir() +
                          "/models/stories260K/stories260K.bin --tokenizer " + test::shared_dir() +
                          "/models/stories260K/tok512.bin --prompt 'Once upon a time' --max-new "
                          "4 -q -o " +
                          dir + "/x.kvtrace.h5 --policy sfc:gates=";
  std::string out;
  CHECK(test::run_command(run + own + ",hot=0.1,window=16", &out) == 2);
  CHECK(out.find("sfc:hot") != std::string::npos);
  CHECK(test::run_command(run + own + ",up=0.4,down=0.6", &out) == 2);
  CHECK(out.find("sfc:down") != std::string::npos);
  CHECK(test::run_command(run + own + ",now=1.5", &out) == 2);
  CHECK(out.find("now") != std::string::npos);
  CHECK(test::run_command(run + other, &out) == 2);
  CHECK(out.find(other) != std::string::npos);
  CHECK(out.find("sfc.latent") != std::string::npos);
}
