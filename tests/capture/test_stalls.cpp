// Stalls (trace format 1.3): a policy that keeps entries in a tier it does not
// attend records each reactive fetch with Decisions::stall; the recorder hands
// them to the trace, and with --oracle the full-cache shadow says whether the
// entry was needed: at or above the 0.9 quantile of its head's full-cache
// attention row (above_quantile), checked by hand and against the dense rows
// of a real model.
#include "tests/capture/capture_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/generate/generator.h"
#include "capture/policy/policy.h"
#include "capture/policy/registry.h"
#include "capture/recorder/capture_run.h"
#include "capture/recorder/oracle.h"
#include "capture/recorder/recorder.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "core/trace/writer.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

const int64_t kM = 64, kPage = 16, kPrompt = 8;

// SFC-shaped tiers: hot, warm (INT4, attended), cold (not attended). The
// prefill demotes positions 0..3 to cold; decode step s (1..4) stalls on
// position s - 1 in every head, waiting 1 ms per layer index + 1, and
// promotes it back to hot.
struct FetchCold : policy::Policy {
  std::vector<cache::TierSpec> tiers() const override {
    return {{"hot", cache::RowFormat::F32, true},
            {"warm", cache::RowFormat::Int4, true},
            {"cold", cache::RowFormat::F32, false}};
  }
  void after_attention(policy::LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      if (c.step == 0)
        for (int64_t p = 0; p < 4; ++p) c.decide.move(c.layer, h, p, 2, 0.0f, 0);
      if (c.step >= 1 && c.step <= 4) {
        c.decide.stall(c.layer, h, c.step - 1, 0.001f * float(c.layer + 1));
        c.decide.move(c.layer, h, c.step - 1, 0, 1.0f, 0);
      }
    }
  }
};

// A capture as run_capture makes one, with a policy outside the registry.
std::string capture(policy::Policy& policy, const std::string& path, int64_t steps) {
  const model::ModelConfig c = test::small_config();
  policy.setup({&c, kM, kPrompt, kPage});
  policy::StepDriver driver(c, {kPage, kM, kPrompt}, policy, "fetch_cold");
  const recorder::CaptureLevels levels =
      recorder::parse_capture_levels("events", c.n_layers, c.n_heads);
  recorder::Recorder rec(driver, nullptr, levels, "");
  trace::RunInfo run;
  run.model = test::model_info(c);
  run.policy = run.policy_name = "fetch_cold";
  run.reason_names = policy.reason_names();
  run.tier_names.clear();
  for (const cache::TierSpec& t : policy.tiers()) {
    run.tier_names.push_back(t.name);
    run.tier_attended.push_back(t.attended ? 1 : 0);
  }
  auto writer =
      trace::TraceWriter::create(path, run, recorder::capture_layout(levels, policy, kM, false, 0));
  for (int64_t s = 0, pos0 = 0; s < steps; ++s) {
    const int64_t n = s == 0 ? kPrompt : 1;
    driver.begin_step(pos0, n);
    for (int64_t l = 0; l < c.n_layers; ++l) driver.attend(test::random_inputs(c, l, pos0, n, 1));
    driver.end_step();
    writer->append_step(rec.finish_step(pos0, std::vector<int32_t>(size_t(n), 5), s == 0, -1));
    pos0 += n;
  }
  writer->close({});
  return path;
}

// One policy hook that stalls as told, for the refusals.
struct StallOnce : policy::Policy {
  int64_t kv_head = 0, pos = 0;
  float wait = 0.001f;
  void after_attention(policy::LayerContext& c) override {
    if (c.layer == 0) c.decide.stall(c.layer, kv_head, pos, wait);
  }
};

std::string stall_error(StallOnce& policy) {
  const model::ModelConfig c = test::small_config();
  policy.setup({&c, kM, 4, kPage});
  policy::StepDriver driver(c, {kPage, kM, 4}, policy, "test");
  driver.begin_step(0, 4);
  try {
    for (int64_t l = 0; l < c.n_layers; ++l) driver.attend(test::random_inputs(c, l, 0, 4, 1));
  } catch (const policy::PolicyError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("stall: a policy's reactive fetches reach the trace, with the tiers it attends",
          "[stalls]") {
  torch::InferenceMode guard;
  FetchCold policy;
  const std::string path = capture(policy, test::temp_dir() + "/stalls.kvtrace.h5", 6);
  auto r = trace::TraceReader::open(path);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1, 1, 0});
  REQUIRE(r->n_steps() == 6);
  const std::vector<trace::StallRow> stalls = r->stalls();
  REQUIRE(stalls.size() == 4 * 2 * 2);  // steps 1..4, 2 layers, 2 kv heads
  for (const trace::StallRow& st : stalls) {
    CHECK(st.token == st.step - 1);
    CHECK(st.wait_s == 0.001f * float(st.layer + 1));
    CHECK(st.needed == -1);  // no oracle
  }
  CHECK(r->stalls_of_step(0).empty());
  CHECK(r->stalls_of_step(5).empty());
  REQUIRE(r->stalls_of_step(2).size() == 4);
  // The fetched entry was in the cold tier and is promoted in the same step.
  for (const trace::StallRow& st : r->stalls_of_step(2)) {
    const std::vector<trace::Event> events = r->step_events(2);
    CHECK(std::any_of(events.begin(), events.end(), [&](const trace::Event& e) {
      return e.kind == trace::EventKind::Promote && e.layer == st.layer &&
             e.kv_head == st.kv_head && e.token == st.token && e.from_tier == 2 && e.to_tier == 0;
    }));
  }
  trace::ValidationReport report = trace::validate_trace(path);
  for (const trace::Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
}

TEST_CASE("stall: a fetch of a head or position that does not exist, or no time, is refused",
          "[stalls]") {
  torch::InferenceMode guard;
  StallOnce head;
  head.kv_head = 2;
  CHECK(stall_error(head) ==
        "policy test: invalid decision 'stall' at step 0, layer 0, kv head 2, position 0: the "
        "model has 2 layers and 2 kv heads");
  StallOnce position;
  position.pos = 4;
  CHECK(stall_error(position) ==
        "policy test: invalid decision 'stall' at step 0, layer 0, kv head 0, position 4: "
        "positions 0..3 exist so far");
  StallOnce negative;
  negative.wait = -0.5f;
  CHECK(stall_error(negative) ==
        "policy test: invalid decision 'stall' at step 0, layer 0, kv head 0, position 0: wait "
        "-0.5 s (expected a finite time >= 0)");
  StallOnce nan;
  nan.wait = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(stall_error(nan), Catch::EndsWith("wait nan s (expected a finite time >= 0)"));
  StallOnce fine;
  CHECK(stall_error(fine) == "no error");
}

TEST_CASE("oracle: needed means at or above the row's 0.9 quantile", "[stalls][oracle]") {
  using recorder::above_quantile;
  // 0..10 shuffled: h = 0.9 * 10 = 9, the quantile is the order statistic 9.
  const std::vector<float> w = {3, 10, 0, 7, 9, 1, 5, 8, 2, 6, 4};
  CHECK(above_quantile(w, 9, 0.9));
  CHECK(above_quantile(w, 10, 0.9));
  CHECK_FALSE(above_quantile(w, 8, 0.9));
  CHECK_FALSE(above_quantile(w, 8.99f, 0.9));
  // Between order statistics it interpolates: {0, 10} at 0.9 is 9.
  CHECK(above_quantile({10, 0}, 9.0f, 0.9));
  CHECK(above_quantile({10, 0}, 9.1f, 0.9));
  CHECK_FALSE(above_quantile({10, 0}, 8.9f, 0.9));
  // Ten weights: h = 8.1, the quantile is 0.9 of the way from the 9th to the 10th.
  const std::vector<float> ten = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1.9f};
  CHECK_FALSE(above_quantile(ten, 0.9f, 0.9));  // quantile 0.9 + 0.1 * 1.0 = 1.0
  CHECK_FALSE(above_quantile(ten, 0.99f, 0.9));
  CHECK(above_quantile(ten, 1.01f, 0.9));
  // Ties: every weight is the quantile.
  CHECK(above_quantile({0.25f, 0.25f, 0.25f, 0.25f}, 0.25f, 0.9));
  // q = 0 is the minimum, q = 1 the maximum; one weight is its own quantile.
  CHECK(above_quantile(w, 0, 0.0));
  CHECK_FALSE(above_quantile(w, 9.99f, 1.0));
  CHECK(above_quantile({0.5f}, 0.5f, 0.9));
  CHECK_FALSE(above_quantile({}, 1.0f, 0.9));
}

TEST_CASE("oracle: needed follows the full cache's last-query row of the head (stories260K)",
          "[stalls][oracle]") {
  torch::InferenceMode guard;
  auto model = test::load_stories();
  const model::ModelConfig& c = model->config();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 317, 272, 277, 264};
  const int64_t P = int64_t(prompt.size()), M = P + 12, R = c.n_heads / c.n_kv_heads;
  policy::PolicyInstance pi = policy::make_policy("full");
  pi.policy->setup({&c, M, P, 16});
  policy::StepDriver::Options options{16, M, P};
  policy::StepDriver driver(c, options, *pi.policy, "full");
  // Dense rows of every query head from the policy run (the full policy
  // attends what the shadow attends).
  recorder::CaptureLevels levels;
  levels.text = "dense";
  for (int32_t l = 0; l < c.n_layers; ++l)
    for (int32_t h = 0; h < c.n_heads; ++h) levels.dense.push_back({l, h});
  recorder::Recorder rec(driver, nullptr, levels, "");
  rec.set_track_attended(true);
  recorder::OracleShadow oracle(*model, options, 4, rec, driver.cache());
  driver.set_observer(&rec);

  generate::Generator g(*model, driver, nullptr);
  generate::GenerationOptions o;
  o.max_new_tokens = 12;
  o.stop_at_eos = false;
  int64_t checked = 0, needed = 0;
  std::vector<int32_t> fed;  // the token each decode step feeds (chosen by the step before)
  g.run(prompt, o, {}, [&](const generate::StepEvent& ev) {
    std::vector<int32_t> ids;
    if (ev.prefill)
      ids.assign(prompt.begin() + ev.pos0, prompt.begin() + ev.pos0 + ev.n);
    else
      ids.push_back(fed.back());
    if (ev.token >= 0) fed.push_back(ev.token);
    rec.pause();
    torch::Tensor t = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
    oracle.step(t, ev.pos0, *ev.logits);
    rec.resume();
    trace::StepData sd = rec.finish_step(ev.pos0, ids, ev.prefill, -1);
    const int64_t q = ev.pos0 + ev.n - 1;  // the step's last query
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        // The group's mean weight on each key, summed as the shadow sums it.
        std::vector<float> mean(size_t(q + 1), 0.0f);
        int64_t rows = 0;
        for (const trace::DenseRow& row : sd.dense) {
          const auto [layer, head] = levels.dense[size_t(row.head_index)];
          if (row.token != q || layer != l || head / R != h) continue;
          ++rows;
          for (int64_t j = 0; j <= q; ++j) mean[size_t(j)] += row.weight[size_t(j)] / float(R);
        }
        REQUIRE(rows == R);
        int64_t head_needed = 0;
        for (int64_t j = 0; j <= q; ++j) {
          const int8_t want =
              recorder::above_quantile(mean, mean[size_t(j)], recorder::kNeededQuantile) ? 1 : 0;
          CHECK(oracle.needed(l, h, j) == want);
          head_needed += want;
          ++checked;
        }
        // About a tenth of the row, never none.
        CHECK(head_needed >= 1);
        CHECK(head_needed <= (q + 1) / 10 + 2);
        needed += head_needed;
      }
    CHECK(oracle.needed(0, 0, q + 1) == -1);  // not fed yet
    CHECK(oracle.needed(c.n_layers, 0, 0) == -1);
  });
  CHECK(checked > 0);
  CHECK(needed > 0);
}

TEST_CASE("a real capture records which tiers are attended and an empty /stalls",
          "[stalls][oracle]") {
  generate::ModelOptions mo;
  mo.model = test::stories_dir() + "/stories260K.bin";
  mo.tokenizer = test::stories_dir() + "/tok512.bin";
  generate::Engine engine = generate::open_engine(mo);
  recorder::CaptureRequest req;
  req.prompt_ids = {1, 403, 407, 261, 378, 432, 317, 272};
  req.prompt_text = engine.tokenizer->decode(req.prompt_ids);
  req.generation.max_new_tokens = 6;
  req.generation.stop_at_eos = false;
  req.policy = "h2o:heavy=4,recent=4";
  req.oracle = true;
  req.output = test::temp_dir() + "/real.kvtrace.h5";
  recorder::run_capture(engine, req);
  auto r = trace::TraceReader::open(req.output);
  CHECK(r->format_minor_version() == trace::kFormatMinorVersion);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1});
  CHECK(r->stalls().empty());  // H2O never fetches from an unattended tier
  CHECK(trace::validate_trace(req.output).ok());
}
