// The policy framework's hooks, each proved with a small scripted policy of
// the shape a seed method needs (docs/architecture.md, "Seed methods on the
// framework"): admission with rejection (WG-KV, Attention-Gate), read-time
// selection (Quest), placement between tiers (the Salience Forecasting
// Cache), one global ranking over all layers and heads in end_step
// (DBTrimKV), delayed scoring at a window boundary (KVpop), and the shared
// attention statistics; and the per-step series a policy records about
// itself (KVpop's cutoff).
#include "tests/capture/capture_test_util.h"

#include <numeric>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/policy/budget.h"
#include "capture/policy/composed.h"
#include "capture/policy/policy.h"
#include "capture/recorder/capture_run.h"
#include "capture/recorder/recorder.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "core/trace/writer.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

const int64_t kM = 128, kPage = 16;

struct Run {
  model::ModelConfig c = test::small_config();
  std::unique_ptr<policy::StepDriver> driver;
  const cache::RaggedKvCache* cache = nullptr;
  std::vector<trace::Event> events;
  explicit Run(policy::Policy& p, int64_t prompt = 32) {
    p.setup({&c, kM, prompt, kPage});
    driver = std::make_unique<policy::StepDriver>(c, policy::StepDriver::Options{kPage, kM, prompt},
                                                  p, "test");
    cache = &driver->cache();
  }
  torch::Tensor step(int64_t pos0, int64_t n, uint64_t seed = 1) {
    driver->begin_step(pos0, n);
    torch::Tensor out;
    for (int64_t l = 0; l < c.n_layers; ++l)
      out = driver->attend(test::random_inputs(c, l, pos0, n, seed));
    driver->end_step();
    for (auto& e : driver->take_events()) events.push_back(e);
    return out;
  }
  int64_t count_events(trace::EventKind kind) const {
    return std::count_if(events.begin(), events.end(), [&](auto& e) { return e.kind == kind; });
  }
};

// Dense attention of one query head over chosen key rows (positions).
torch::Tensor reference(const model::AttentionInputs& in, int64_t query, int64_t head,
                        const std::vector<int64_t>& rows) {
  int64_t kv = head / (in.q.size(1) / in.k.size(1));
  torch::Tensor Kt = in.k.index_select(0, torch::tensor(rows)).select(1, kv);
  torch::Tensor Vt = in.v.index_select(0, torch::tensor(rows)).select(1, kv);
  torch::Tensor s = torch::mv(Kt, in.q[query][head]) * in.scale;
  return torch::mv(Vt.t(), torch::softmax(s, 0));
}

}  // namespace

TEST_CASE("admission: a rejected token serves its own step and never enters the cache", "[hooks]") {
  torch::InferenceMode guard;
  struct RejectOdd : policy::Policy {
    void admit(policy::AdmitContext& c) override {
      for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
        for (int64_t i = 0; i < c.n; ++i)
          if ((c.pos0 + i) % 2 == 1) c.at(h, i) = {0, true, 0.25f, 0};
    }
  } policy;
  Run run(policy);
  run.step(0, 8);
  for (int64_t h = 0; h < 2; ++h) CHECK(run.cache->count(1, h) == 4);
  CHECK(run.count_events(trace::EventKind::Reject) ==
        4 * 2 * 2);  // 4 odd tokens, 2 heads, 2 layers
  CHECK(run.count_events(trace::EventKind::Admit) == 4 * 2 * 2);
  // The next decode query reads only the even positions and itself.
  model::AttentionInputs prev = test::random_inputs(run.c, 1, 0, 8, 1);
  run.driver->begin_step(8, 1);
  run.driver->attend(test::random_inputs(run.c, 0, 8, 1, 1));
  model::AttentionInputs in = test::random_inputs(run.c, 1, 8, 1, 1);
  torch::Tensor out = run.driver->attend(in);
  model::AttentionInputs all = prev;
  all.k = torch::cat({prev.k, in.k});
  all.v = torch::cat({prev.v, in.v});
  all.q = torch::cat({prev.q, in.q});
  torch::Tensor want = reference(all, 8, 0, {0, 2, 4, 6, 8});
  CHECK((out[0][0] - want).abs().max().item<float>() < 1e-5f);
}

TEST_CASE("selection: a read-time mask restricts what a query reads, the cache is untouched",
          "[hooks]") {
  torch::InferenceMode guard;
  struct SelectLowHalf : policy::Policy {  // Quest-like: pages 0 and 2 only
    void select(policy::SelectContext& c) override {
      for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
        const auto& cand = c.candidates[size_t(h)];
        torch::Tensor mask = torch::zeros({c.n, int64_t(cand.size())}, torch::kBool);
        for (size_t j = 0; j < cand.size(); ++j) {
          bool page_selected = (cand[j] / 16) % 2 == 0;
          if (page_selected) mask.select(1, int64_t(j)).fill_(true);
          if (page_selected && cand[j] % 16 == 0) c.decide.select(c.layer, h, cand[j], 1.0f, 0);
        }
        c.masks[size_t(h)] = mask;
      }
    }
  } policy;
  Run run(policy, 48);
  run.step(0, 48);
  model::AttentionInputs prev = test::random_inputs(run.c, 1, 0, 48, 1);
  run.driver->begin_step(48, 1);
  run.driver->attend(test::random_inputs(run.c, 0, 48, 1, 1));
  model::AttentionInputs in = test::random_inputs(run.c, 1, 48, 1, 1);
  torch::Tensor out = run.driver->attend(in);
  run.driver->end_step();
  std::vector<int64_t> rows;
  for (int64_t p = 0; p < 48; ++p)
    if ((p / 16) % 2 == 0) rows.push_back(p);
  rows.push_back(48);  // the query's own key is always read
  model::AttentionInputs all = prev;
  all.k = torch::cat({prev.k, in.k});
  all.v = torch::cat({prev.v, in.v});
  all.q = torch::cat({prev.q, in.q});
  CHECK((out[0][3] - reference(all, 48, 3, rows)).abs().max().item<float>() < 1e-5f);
  CHECK(run.cache->count(1, 1) == 49);  // nothing was evicted
  for (auto& e : run.driver->take_events()) run.events.push_back(e);
  CHECK(run.count_events(trace::EventKind::Select) > 0);
}

TEST_CASE("placement: entries move between tiers, cold entries are not read until promoted",
          "[hooks]") {
  torch::InferenceMode guard;
  struct Tiers : policy::Policy {
    std::vector<cache::TierSpec> tiers() const override {
      return {{"hot", cache::RowFormat::F32, true},
              {"warm", cache::RowFormat::Int4, true},
              {"cold", cache::RowFormat::F32, false}};
    }
    void after_attention(policy::LayerContext& c) override {
      if (c.step == 0)
        for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
          for (int64_t p = 0; p < 8; ++p) c.decide.move(c.layer, h, p, p < 4 ? 2 : 1, 0.5f, 0);
      if (c.step == 2)
        for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
          for (int64_t p = 0; p < 4; ++p) c.decide.move(c.layer, h, p, 0, 0.9f, 0);
    }
  } policy;
  Run run(policy, 16);
  run.step(0, 16);
  CHECK(run.cache->count(0, 0, 0) == 8);
  CHECK(run.cache->count(0, 0, 1) == 4);
  CHECK(run.cache->count(0, 0, 2) == 4);
  CHECK(run.count_events(trace::EventKind::Demote) == 8 * 2 * 2);
  // Decode: the cold entries 0..3 are not read.
  struct Watch : cache::FullMatrixObserver {
    bool wants_probs(int64_t) const override { return true; }
    void on_attention(int64_t, int64_t, const float*, int64_t, int64_t, int64_t m,
                      const int64_t* key_pos, int64_t) override {
      keys.assign(key_pos, key_pos + m);
    }
    std::vector<int64_t> keys;
  } watch;
  run.driver->set_observer(&watch);
  run.step(16, 1);
  for (int64_t p : watch.keys) CHECK(p >= 4);
  run.step(17, 1);  // step 2 promotes them back to hot
  CHECK(run.cache->count(0, 0, 2) == 0);
  CHECK(run.count_events(trace::EventKind::Promote) == 4 * 2 * 2);
  run.step(18, 1);
  CHECK(std::count_if(watch.keys.begin(), watch.keys.end(), [](int64_t p) { return p < 4; }) == 4);
}

TEST_CASE("end_step: one global ranking over all layers and heads gives unequal head budgets",
          "[hooks]") {
  torch::InferenceMode guard;
  struct GlobalTopB : policy::Policy {  // DBTrimKV-shaped: keep the B best entries of the model
    int64_t B = 40;
    cache::StatsNeeds stats_needs() const override { return {true, false, 0}; }
    void end_step(policy::StepContext& c) override {
      std::vector<std::tuple<float, int64_t, int64_t, int64_t>> all;  // (score, layer, head, pos)
      for (int64_t l = 0; l < c.cache.n_layers(); ++l)
        for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
          for (int32_t p : c.cache.positions(l, h, 0))
            all.emplace_back(
                c.layer_stats[size_t(l)].received[size_t(h)][size_t(p)] + float(l * 2 + h) * 0.05f,
                l, h, p);
      std::sort(all.begin(), all.end(), std::greater<>());
      for (size_t i = size_t(B); i < all.size(); ++i)
        c.decide.evict(std::get<1>(all[i]), std::get<2>(all[i]), std::get<3>(all[i]),
                       std::get<0>(all[i]), 0);
    }
  } policy;
  Run run(policy);
  run.step(0, 32);
  for (int64_t p = 32; p < 40; ++p) run.step(p, 1);
  CHECK(run.cache->entries() == policy.B);
  std::vector<int64_t> per_head;
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 2; ++h) per_head.push_back(run.cache->count(l, h));
  CHECK(*std::max_element(per_head.begin(), per_head.end()) >
        *std::min_element(per_head.begin(), per_head.end()));
}

TEST_CASE("delayed scoring: tokens are judged when they leave a protected window (KVpop)",
          "[hooks]") {
  torch::InferenceMode guard;
  // Scores accumulate while a token is inside the last W positions; when it
  // crosses the boundary it stays only if its accumulated score beats a
  // threshold. The decision for token p happens exactly at the step that
  // feeds p + W.
  struct Delayed : policy::Policy {
    int64_t W = 8;
    policy::HeadScores acc;
    std::vector<std::pair<int64_t, int64_t>> judged;  // (step's first position, token)
    void setup(const policy::PolicySetup& s) override {
      Policy::setup(s);
      acc.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens);
    }
    cache::StatsNeeds stats_needs() const override { return {true, false, 0}; }
    void after_attention(policy::LayerContext& c) override {
      const int64_t fed = c.tokens_fed();
      for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
        float* a = acc.at(c.layer, h);
        std::vector<int64_t> leaving;
        for (int32_t p : c.cache.positions(c.layer, h, 0)) {
          if (p >= fed - W) a[p] += c.stats.received[size_t(h)][size_t(p)];
          if (p == fed - W - 1) leaving.push_back(p);  // just crossed the boundary
        }
        for (int64_t p : leaving) {
          if (c.layer == 0 && h == 0) judged.push_back({c.pos0, p});
          if (a[p] < 0.2f) c.decide.evict(c.layer, h, p, a[p], 0);
        }
      }
    }
  } policy;
  Run run(policy, 1);
  for (int64_t p = 0; p < 40; ++p) run.step(p, 1);
  REQUIRE(policy.judged.size() == 40 - 8);
  for (auto [pos0, token] : policy.judged) CHECK(token == pos0 - 8);
  CHECK(run.count_events(trace::EventKind::Evict) > 0);
}

TEST_CASE(
    "shared statistics: received sums to one per decode query, windows accumulate over chunks",
    "[hooks]") {
  torch::InferenceMode guard;
  struct Stats : policy::Policy {
    cache::StatsNeeds stats_needs() const override { return {true, true, 12}; }
    std::vector<double> received_sums;
    std::vector<int64_t> window_queries;
    void after_attention(policy::LayerContext& c) override {
      if (c.layer != 1) return;
      double s = 0;
      for (int32_t p : c.cache.positions(1, 0, 0)) s += c.stats.received[0][size_t(p)];
      received_sums.push_back(s);
      window_queries.push_back(c.stats.window_queries);
    }
  } policy;
  Run run(policy, 32);
  for (int64_t p = 0; p < 32; p += 8) run.step(p, 8);  // prefill in four chunks
  run.step(32, 1);
  for (double s : policy.received_sums) CHECK(std::abs(s - 1.0) < 1e-4);
  // The observation window is the last 12 prompt queries: 4 in chunk 3, 8 in chunk 4.
  CHECK(policy.window_queries == std::vector<int64_t>{0, 0, 4, 12, 12});
}

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i])) return false;
  return true;
}

// A policy that records one value per step and head, as KVpop records its
// cutoff: step * 10 + layer * 2 + head, leaving (layer 0, head 1) out on even
// steps, each after a first value that the second replaces.
struct Cutoff : policy::Policy {
  std::vector<trace::SeriesSpec> series() const override {
    return {{"cutoff", "step * 10 + layer * 2 + kv head", "score"}};
  }
  void after_attention(policy::LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      if (c.layer == 0 && h == 1 && c.step % 2 == 0) continue;
      c.decide.series(0, c.layer, h, -1.0f);
      c.decide.series(0, c.layer, h, float(c.step * 10 + c.layer * 2 + h));
    }
  }
  static float expected(int64_t step, int64_t layer, int64_t h) {
    return layer == 0 && h == 1 && step % 2 == 0 ? kNaN : float(step * 10 + layer * 2 + h);
  }
};

// A capture as run_capture makes one, with a policy outside the registry:
// step driver, recorder and writer, the layout from capture_layout.
std::string capture_series(policy::Policy& policy, const std::string& path, int64_t steps) {
  const model::ModelConfig c = test::small_config();
  const int64_t prompt = 8;
  policy.setup({&c, kM, prompt, kPage});
  policy::StepDriver driver(c, {kPage, kM, prompt}, policy, "cutoff");
  const recorder::CaptureLevels levels =
      recorder::parse_capture_levels("events", c.n_layers, c.n_heads);
  recorder::Recorder rec(driver, nullptr, levels, "");
  trace::RunInfo run;
  run.model = test::model_info(c);
  run.policy = run.policy_name = "cutoff";
  run.reason_names = policy.reason_names();
  auto writer =
      trace::TraceWriter::create(path, run, recorder::capture_layout(levels, policy, kM, false, 0));
  for (int64_t s = 0, pos0 = 0; s < steps; ++s) {
    const int64_t n = s == 0 ? prompt : 1;
    driver.begin_step(pos0, n);
    for (int64_t l = 0; l < c.n_layers; ++l) driver.attend(test::random_inputs(c, l, pos0, n, 1));
    driver.end_step();
    writer->append_step(rec.finish_step(pos0, std::vector<int32_t>(size_t(n), 5), s == 0, -1));
    pos0 += n;
  }
  writer->close({});
  return path;
}

}  // namespace

TEST_CASE("series: a policy's value per step and head reaches the trace, holes as NaN",
          "[hooks][series]") {
  torch::InferenceMode guard;
  Cutoff policy;
  const std::string path = capture_series(policy, test::temp_dir() + "/cutoff.kvtrace.h5", 4);
  auto r = trace::TraceReader::open(path);
  REQUIRE(r->series().size() == 1);
  CHECK(r->series()[0].name == "cutoff");
  CHECK(r->series()[0].units == "score");
  REQUIRE(r->n_steps() == 4);
  std::vector<float> want;
  for (int64_t s = 0; s < 4; ++s)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t h = 0; h < 2; ++h) want.push_back(Cutoff::expected(s, l, h));
  CHECK(same_values(r->series_values(0, 0, 4), want));
  CHECK(same_values(r->series_head(0, 0, 1, 0, 4), {kNaN, 11, kNaN, 31}));
  CHECK(trace::validate_trace(path).ok());
}

TEST_CASE("series: a composite maps each part's series numbers onto its own table",
          "[hooks][series]") {
  torch::InferenceMode guard;
  // Part a declares two series and records its second; part b declares one
  // and records it, or (bad) its own series 1, which it does not declare.
  struct PartA : policy::Policy {
    std::vector<trace::SeriesSpec> series() const override {
      return {{"a0", "first of a", "1"}, {"a1", "second of a", "1"}};
    }
    void after_attention(policy::LayerContext& c) override {
      c.decide.series(1, c.layer, 0, 1.0f + float(c.layer));
    }
  };
  struct PartB : policy::Policy {
    int32_t index = 0;
    std::vector<trace::SeriesSpec> series() const override { return {{"b0", "only of b", "1"}}; }
    void after_attention(policy::LayerContext& c) override {
      c.decide.series(index, c.layer, 1, 2.0f + float(c.layer));
    }
  };
  auto b = std::make_unique<PartB>();
  PartB* part_b = b.get();
  std::vector<policy::ComposedPolicy::Part> parts;
  parts.push_back({"a", std::make_unique<PartA>()});
  parts.push_back({"b", std::move(b)});
  policy::ComposedPolicy composed("a+b", std::move(parts));
  std::vector<std::string> names;
  for (const trace::SeriesSpec& sp : composed.series()) names.push_back(sp.name);
  CHECK(names == std::vector<std::string>{"a0", "a1", "b0"});

  Run run(composed, 4);
  run.step(0, 4);
  // [series][layer][kv head]: a's 1 -> 1, b's 0 -> 2.
  std::vector<float> want(3 * 2 * 2, kNaN);
  for (int64_t l = 0; l < 2; ++l) {
    want[size_t((1 * 2 + l) * 2 + 0)] = 1.0f + float(l);
    want[size_t((2 * 2 + l) * 2 + 1)] = 2.0f + float(l);
  }
  CHECK(same_values(run.driver->take_series(), want));
  CHECK(run.driver->take_series().empty());  // taken: nothing until the next value

  part_b->index = 1;
  CHECK_THROWS_WITH(run.step(4, 1),
                    "policy b: invalid decision 'series' at step 1, layer 0, kv head 1: series 1 "
                    "(the policy declares 1 series)");
}

TEST_CASE("series: a value for a head that does not exist is refused", "[hooks][series]") {
  torch::InferenceMode guard;
  struct Wrong : policy::Policy {
    std::vector<trace::SeriesSpec> series() const override { return {{"s", "", "1"}}; }
    void after_attention(policy::LayerContext& c) override { c.decide.series(0, c.layer, 2, 0); }
  } policy;
  Run run(policy, 4);
  CHECK_THROWS_WITH(run.step(0, 4),
                    "policy test: invalid decision 'series' at step 0, layer 0, kv head 2: the "
                    "model has 2 layers and 2 kv heads");
}
