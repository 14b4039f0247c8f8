// Round trip of every group: what the synthetic capture hands the writer is
// exactly what the reader returns.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include "core/trace/half.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "tests/core/trace_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using namespace kvscope::trace;

namespace {

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

struct Expected {
  std::vector<StepData> steps;
  std::vector<TokenRecord> tokens;
  std::vector<Event> events;
};

Expected expected_of(const SyntheticCapture& cap) {
  Expected e;
  for (int64_t s = 0; s < cap.n_steps(); ++s) {
    e.steps.push_back(cap.step(s));
    for (const auto& t : e.steps.back().tokens) e.tokens.push_back(t);
    for (const auto& ev : e.steps.back().events) e.events.push_back(ev);
  }
  return e;
}

void check_roundtrip(int64_t tiers, int64_t prefill_chunk) {
  std::string dir = test::temp_dir();
  SyntheticSpec spec = test::small_spec(tiers, prefill_chunk);
  std::string path = test::write_small_trace(dir, "t.kvtrace.h5", tiers, prefill_chunk);
  SyntheticCapture cap(spec);
  Expected exp = expected_of(cap);
  auto r = TraceReader::open(path);

  // /run
  const RunInfo& run = r->run();
  CHECK(r->format_version() == kFormatVersion);
  CHECK(r->complete());
  CHECK(r->finish_reason() == "length");
  CHECK(r->task_success() == -1);
  CHECK(run.policy == cap.run().policy);
  CHECK(run.policy_params_json == cap.run().policy_params_json);
  CHECK(run.prompt == cap.run().prompt);
  CHECK(run.tier_names == cap.run().tier_names);
  CHECK(run.reason_names == cap.run().reason_names);
  CHECK(run.seed == spec.seed);
  CHECK(run.model.n_layers == spec.layers);
  CHECK(run.model.n_heads == spec.heads);
  CHECK(run.model.n_kv_heads == spec.kv_heads);
  CHECK(r->layout().max_tokens == spec.prompt_tokens + spec.decode_steps);
  CHECK(r->layout().pooled_block == spec.pooled_block);
  CHECK(r->layout().topk == spec.topk);
  CHECK(r->layout().dense_heads == cap.layout().dense_heads);
  REQUIRE(r->layout().gates.size() == 2);
  CHECK(r->layout().gates[0].name == "synthetic_gate");
  CHECK(r->layout().gates[0].threshold == 0.5);
  CHECK(r->layout().gates[1].time_varying);

  // /steps
  REQUIRE(r->n_steps() == cap.n_steps());
  REQUIRE(r->n_tokens() == static_cast<int64_t>(exp.tokens.size()));
  REQUIRE(r->n_events() == static_cast<int64_t>(exp.events.size()));
  std::vector<StepRecord> steps = r->steps(0, r->n_steps());
  int64_t event_begin = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const StepRecord& want = exp.steps[s].step;
    CHECK(steps[s].kind == want.kind);
    CHECK(steps[s].first_token == want.first_token);
    CHECK(steps[s].n_tokens == want.n_tokens);
    CHECK(steps[s].t_start_s == want.t_start_s);
    CHECK(steps[s].wall_s == want.wall_s);
    CHECK(steps[s].entries == want.entries);
    CHECK(steps[s].kv_bytes == want.kv_bytes);
    CHECK(steps[s].event_begin == event_begin);
    CHECK(steps[s].event_count == static_cast<int64_t>(exp.steps[s].events.size()));
    event_begin += steps[s].event_count;
  }

  // /tokens
  std::vector<TokenRecord> tokens = r->tokens(0, r->n_tokens());
  for (size_t t = 0; t < tokens.size(); ++t) {
    CHECK(tokens[t].id == exp.tokens[t].id);
    CHECK(tokens[t].position == exp.tokens[t].position);
    CHECK(tokens[t].role == exp.tokens[t].role);
    CHECK(tokens[t].step == exp.tokens[t].step);
    CHECK(tokens[t].prompt_offset == exp.tokens[t].prompt_offset);
    CHECK(tokens[t].text == exp.tokens[t].text);
    if (tokens[t].prompt_offset >= 0)
      CHECK(run.prompt.substr(size_t(tokens[t].prompt_offset), tokens[t].text.size()) ==
            tokens[t].text);
  }
  // A middle slice reads the same as the whole.
  std::vector<TokenRecord> slice = r->tokens(10, 20);
  CHECK(slice[3].text == tokens[13].text);

  // /events
  std::vector<Event> events = r->events(0, r->n_events());
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& a = events[i];
    const Event& b = exp.events[i];
    CHECK((a.step == b.step && a.layer == b.layer && a.kv_head == b.kv_head && a.token == b.token &&
           a.kind == b.kind && same_float(a.score, b.score) && a.reason == b.reason &&
           a.from_tier == b.from_tier && a.to_tier == b.to_tier));
  }
  std::vector<Event> step3 = r->step_events(3);
  CHECK(step3.size() == exp.steps[3].events.size());

  // /lifetimes: the synthetic policy's ground truth.
  for (int l = 0; l < spec.layers; ++l)
    for (int k = 0; k < spec.kv_heads; ++k) {
      HeadLifetimes life = r->lifetimes(l, k);
      REQUIRE(life.admit_step.size() == tokens.size());
      for (size_t t = 0; t < tokens.size(); ++t) {
        CHECK(life.admit_step[t] == synthetic_admit_step(spec, int64_t(t)));
        CHECK(life.evict_step[t] == synthetic_evict_step(spec, l, k, int64_t(t)));
      }
    }

  // /lifetimes/intervals: replay the events.
  if (tiers > 1) {
    for (int l = 0; l < spec.layers; ++l)
      for (int k = 0; k < spec.kv_heads; ++k) {
        std::map<int32_t, TierInterval> open;
        std::vector<TierInterval> want;
        for (const Event& e : exp.events) {
          if (e.layer != l || e.kv_head != k) continue;
          auto close = [&] {
            auto it = open.find(e.token);
            if (it == open.end()) return;
            it->second.end_step = e.step;
            want.push_back(it->second);
            open.erase(it);
          };
          if (e.kind == EventKind::Admit)
            open[e.token] = {int16_t(l), int16_t(k), e.token, e.to_tier, e.step, -1};
          if (e.kind == EventKind::Evict) close();
          if (e.kind == EventKind::Demote || e.kind == EventKind::Promote) {
            close();
            open[e.token] = {int16_t(l), int16_t(k), e.token, e.to_tier, e.step, -1};
          }
        }
        for (auto& [t, iv] : open) want.push_back(iv);
        auto key = [](const TierInterval& i) { return std::make_tuple(i.token, i.begin_step); };
        std::sort(want.begin(), want.end(), [&](auto& a, auto& b) { return key(a) < key(b); });
        std::vector<TierInterval> got = r->intervals(l, k);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i)
          CHECK((got[i].token == want[i].token && got[i].tier == want[i].tier &&
                 got[i].begin_step == want[i].begin_step && got[i].end_step == want[i].end_step));
      }
  } else {
    CHECK(r->intervals(0, 0).empty());
  }

  // /occupancy
  for (int64_t s = 0; s < r->n_steps(); ++s) {
    CHECK(r->occupancy(s) == exp.steps[size_t(s)].occupancy);
    CHECK(r->tier_bytes(s, s + 1) == exp.steps[size_t(s)].tier_bytes);
  }
  std::vector<int32_t> series = r->occupancy_series(1, 1, 0, r->n_steps());
  for (int64_t s = 0; s < r->n_steps(); ++s)
    CHECK(series[size_t(s * tiers)] ==
          exp.steps[size_t(s)].occupancy[size_t((1 * spec.kv_heads + 1) * tiers)]);

  // /attention/received
  for (int64_t s = 0; s < r->n_steps(); s += 5)
    for (const ReceivedRow& want : exp.steps[size_t(s)].received) {
      ReceivedRow got = r->received(s, want.layer, want.kv_head);
      CHECK(got.tokens == want.tokens);
      CHECK(got.mass == want.mass);
    }

  // /attention/pooled (stored as float16)
  int64_t KB = r->pooled_key_blocks();
  CHECK(r->pooled_query_blocks() == KB);
  std::map<std::pair<int, int>, PooledRow> last;
  for (const auto& sd : exp.steps)
    for (const auto& row : sd.pooled) last[{row.layer, row.query_block}] = row;
  for (int l = 0; l < spec.layers; ++l)
    for (int h = 0; h < spec.heads; h += 3) {
      PooledTile tile = r->pooled(l, h, 0, KB, 0, KB);
      for (int64_t qb = 0; qb < KB; ++qb)
        for (int64_t kb = 0; kb < KB; ++kb) {
          const PooledRow& row = last.at({l, int(qb)});
          float want_max = half_to_float(float_to_half(row.max[size_t(h * KB + kb)]));
          float want_mean = half_to_float(float_to_half(row.mean[size_t(h * KB + kb)]));
          CHECK(tile.max[size_t(qb * KB + kb)] == want_max);
          CHECK(tile.mean[size_t(qb * KB + kb)] == want_mean);
        }
    }
  PooledTile corner = r->pooled(2, 1, 3, 5, 1, 4);
  CHECK(corner.max.size() == 6);

  // /attention/dense and /attention/topk
  for (const auto& sd : exp.steps)
    for (const DenseRow& row : sd.dense)
      CHECK(r->dense_rows(row.head_index, row.token, row.token + 1) == row.weight);
  for (const auto& sd : exp.steps)
    for (const TopkRow& row : sd.topk) {
      TopkRow got = r->topk(row.token);
      CHECK(got.index == row.index);
      CHECK(got.weight == row.weight);
    }

  // /gates: static values are the last written; samples in order.
  std::vector<GateValue> samples_want;
  std::vector<int32_t> sample_steps_want;
  for (size_t s = 0; s < exp.steps.size(); ++s)
    for (const GateValue& g : exp.steps[s].gates)
      if (g.gate == 1) {
        samples_want.push_back(g);
        sample_steps_want.push_back(int32_t(s));
      }
  for (int l = 0; l < spec.layers; ++l)
    for (int k = 0; k < spec.kv_heads; ++k) {
      std::vector<float> v = r->gate_values(0, l, k);
      for (size_t t = 0; t < v.size(); ++t) CHECK(v[t] == synthetic_gate(spec, l, k, int64_t(t)));
    }
  REQUIRE(r->gate_sample_count(1) == static_cast<int64_t>(samples_want.size()));
  std::vector<int32_t> sample_steps;
  std::vector<GateValue> samples = r->gate_samples(1, 0, r->gate_sample_count(1), &sample_steps);
  CHECK(sample_steps == sample_steps_want);
  for (size_t i = 0; i < samples.size(); ++i)
    CHECK((samples[i].layer == samples_want[i].layer && samples[i].token == samples_want[i].token &&
           samples[i].value == samples_want[i].value));

  // /series: the synthetic cutoff, NaN where nothing was recorded.
  REQUIRE(r->series().size() == 1);
  CHECK(r->series()[0].name == "cutoff");
  std::vector<float> cutoff = r->series_values(0, 0, r->n_steps());
  REQUIRE(cutoff.size() == size_t(r->n_steps() * spec.layers * spec.kv_heads));
  for (int64_t s = 0; s < r->n_steps(); ++s)
    for (int l = 0; l < spec.layers; ++l)
      for (int k = 0; k < spec.kv_heads; ++k)
        CHECK(same_float(cutoff[size_t((s * spec.layers + l) * spec.kv_heads + k)],
                         synthetic_series(spec, s, l, k)));
  std::vector<float> head = r->series_head(0, 2, 1, 0, r->n_steps());
  for (int64_t s = 0; s < r->n_steps(); ++s)
    CHECK(same_float(head[size_t(s)], synthetic_series(spec, s, 2, 1)));

  // /oracle
  std::vector<float> kl = r->oracle_kl(0, r->n_steps());
  for (size_t s = 0; s < kl.size(); ++s) {
    CHECK(kl[s] == exp.steps[s].oracle.kl);
    CHECK(r->oracle_lost_mass(int64_t(s)) == exp.steps[s].oracle.lost_mass);
    CHECK(r->oracle_recall(int64_t(s)) == exp.steps[s].oracle.recall);
  }

  // /generation
  std::string text;
  for (const auto& sd : exp.steps) text += sd.generated_text;
  CHECK(r->generated_text() == text);

  ValidationReport report = validate_trace(path);
  for (const auto& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
  CHECK(report.complete);
}

}  // namespace

TEST_CASE("every group round-trips (one tier, one prefill step)", "[trace]") {
  check_roundtrip(1, 0);
}

TEST_CASE("every group round-trips (two tiers, chunked prefill)", "[trace]") {
  check_roundtrip(2, 7);
}

TEST_CASE("the same capture writes the same data", "[trace]") {
  std::string dir = test::temp_dir();
  std::string a = test::write_small_trace(dir, "a.h5", 2, 5);
  std::string b = test::write_small_trace(dir, "b.h5", 2, 5);
  auto ra = TraceReader::open(a), rb = TraceReader::open(b);
  REQUIRE(ra->n_events() == rb->n_events());
  std::vector<Event> ea = ra->events(0, ra->n_events()), eb = rb->events(0, rb->n_events());
  for (size_t i = 0; i < ea.size(); ++i)
    REQUIRE((ea[i].token == eb[i].token && ea[i].kind == eb[i].kind &&
             same_float(ea[i].score, eb[i].score)));
  for (int64_t s = 0; s < ra->n_steps(); ++s) REQUIRE(ra->occupancy(s) == rb->occupancy(s));
}

TEST_CASE("float16 conversion rounds to nearest even and keeps range", "[trace]") {
  CHECK(half_to_float(float_to_half(0.0f)) == 0.0f);
  CHECK(half_to_float(float_to_half(1.0f)) == 1.0f);
  CHECK(half_to_float(float_to_half(0.5f)) == 0.5f);
  CHECK(half_to_float(float_to_half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(half_to_float(float_to_half(65520.0f))));
  CHECK(half_to_float(float_to_half(1e-7f)) == Approx(1.1920929e-7f));  // subnormal: 2 * 2^-24
  CHECK(half_to_float(float_to_half(1.0f + 1.0f / 2048.0f)) == 1.0f);   // tie -> even
  CHECK(half_to_float(float_to_half(1.0f + 3.0f / 2048.0f)) == 1.0f + 2.0f / 1024.0f);
  for (uint32_t h = 0; h < 0x7C00; ++h)  // every finite positive half survives the round trip
    REQUIRE(float_to_half(half_to_float(static_cast<uint16_t>(h))) == h);
}

TEST_CASE("a trace held in memory reads and validates as its file does", "[trace][image]") {
  const std::string path = test::write_small_trace(test::temp_dir(), "image.kvtrace.h5", 2);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 1000);
  auto file = TraceReader::open(path);
  auto image = TraceReader::open_image("in-memory", bytes.data(), bytes.size());
  CHECK(image->path() == "in-memory");
  CHECK(image->n_steps() == file->n_steps());
  CHECK(image->n_events() == file->n_events());
  CHECK(image->run().policy == file->run().policy);
  const auto a = file->events(0, file->n_events()), b = image->events(0, image->n_events());
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK((a[i].token == b[i].token && a[i].kind == b[i].kind));
  CHECK(image->intervals(0, 0).size() == file->intervals(0, 0).size());
  const ValidationReport report = validate_trace_image("in-memory", bytes.data(), bytes.size());
  CHECK(report.ok());
  CHECK(report.n_events == validate_trace(path).n_events);

  const std::string junk = "not an HDF5 file at all";
  CHECK_THROWS_WITH(TraceReader::open_image("junk", junk.data(), junk.size()),
                    Catch::Contains("junk: not an HDF5 file"));
  CHECK_THROWS_WITH(TraceReader::open_image("empty", junk.data(), 0),
                    Catch::Contains("empty: empty file"));
  // A truncated image is refused as damaged, naming the image.
  CHECK_THROWS_WITH(TraceReader::open_image("cut", bytes.data(), bytes.size() / 2),
                    Catch::StartsWith("cut: "));
}
