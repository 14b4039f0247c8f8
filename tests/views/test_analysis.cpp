// core/analysis behind the views, checked against the synthetic policy's
// ground truth (synthetic_evict_step and friends) and brute force.
#include <utime.h>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/analysis/attention_lod.h"
#include "core/analysis/lifetimes.h"
#include "core/analysis/perfetto.h"
#include "core/analysis/survival.h"
#include "core/analysis/trace_diff.h"
#include "tests/views/synthetic_fixture.h"

using namespace kvscope;
using analysis::held_at;

namespace {
bool truth_held(const trace::SyntheticSpec& spec, int l, int k, int64_t t, int64_t step) {
  return held_at(trace::synthetic_admit_step(spec, t), trace::synthetic_evict_step(spec, l, k, t),
                 step);
}
}  // namespace

TEST_CASE(
    "a token evicted at step 7 from head (0, 2) is evicted exactly there in the folded timeline") {
  trace::SyntheticSpec spec = test::small_spec();
  auto r = trace::TraceReader::open(test::write_trace(spec));
  REQUIRE(trace::synthetic_evict_step(spec, 0, 2, 30) == 7);
  analysis::HeadTimeline h = analysis::HeadTimeline::read(*r, 0, 2);
  const int S = int(r->n_steps()), T = int(r->n_tokens());
  // One pixel per step and per token: every cell must be exactly one class.
  analysis::TimelineRaster raster = analysis::fold_timeline(h, 0, S, 0, T, S, T);
  const int evicted = raster.classes.evicted();
  CHECK(raster.at(7, 30, evicted) == Approx(1.0));
  CHECK(raster.at(6, 30, 0) == Approx(1.0));
  CHECK(raster.at(6, 30, evicted) == Approx(0.0));
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < S; ++s) {
      bool held = truth_held(spec, 0, 2, t, s);
      INFO("token " << t << " step " << s);
      REQUIRE(raster.at(s, t, 0) == Approx(held ? 1.0 : 0.0));
    }
}

TEST_CASE("folding many tokens into one pixel keeps the share of held cells") {
  trace::SyntheticSpec spec = test::small_spec();
  auto r = trace::TraceReader::open(test::write_trace(spec));
  analysis::HeadTimeline h = analysis::HeadTimeline::read(*r, 1, 3);
  const int S = int(r->n_steps()), T = int(r->n_tokens());
  analysis::TimelineRaster one = analysis::fold_timeline(h, 0, S, 0, T, 1, 1);
  int64_t held = 0;
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < S; ++s) held += truth_held(spec, 1, 3, t, s);
  CHECK(one.at(0, 0, 0) == Approx(double(held) / (double(S) * T)).epsilon(1e-4));
}

TEST_CASE("per-layer head counts match the synthetic policy (seed 003, fig. 6)") {
  trace::SyntheticSpec spec = test::small_spec();
  auto r = trace::TraceReader::open(test::write_trace(spec));
  analysis::AllLifetimes all = analysis::AllLifetimes::read(*r);
  for (int64_t step : {0, 5, 20}) {
    std::vector<uint16_t> counts = analysis::layer_head_counts(all, step);
    for (int l = 0; l < spec.layers; ++l)
      for (int64_t t = 0; t < all.n_tokens(); ++t) {
        int n = 0;
        for (int k = 0; k < spec.kv_heads; ++k) n += truth_held(spec, l, k, t, step);
        REQUIRE(counts[size_t(l * all.n_tokens() + t)] == n);
      }
  }
}

TEST_CASE("survival of held and of attended tokens match brute force") {
  trace::SyntheticSpec spec = test::small_spec();
  auto r = trace::TraceReader::open(test::write_trace(spec));
  const int64_t T = r->n_tokens();
  std::vector<int32_t> fed(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) fed[size_t(t)] = trace::synthetic_step_of_token(spec, t);
  analysis::LastAttended last = analysis::LastAttended::read(*r, 0.9, 2, 1);
  CHECK(last.criterion == "top-4");
  analysis::SurvivalCurve c = analysis::survival(r->lifetimes(2, 1), fed, last.head(2, 1), T - 1);
  for (int64_t h = 0; h < T; ++h) {
    int64_t n = 0;
    for (int64_t t = 0; t + h < T; ++t) n += truth_held(spec, 2, 1, t, fed[size_t(t + h)]);
    REQUIRE(c.held[size_t(h)] == Approx(double(n) / double(T - h)));
    REQUIRE(c.at_risk[size_t(h)] == T - h);
  }
  // Attention survival from the top-k rows by brute force: alive at h when a
  // query at t + h or later has t in its top-k (query heads 2, 3 of kv head 1).
  std::vector<int64_t> last_q(static_cast<size_t>(T), -1);
  const int64_t H = spec.heads, k = spec.topk;
  for (int64_t q = 0; q < T; ++q) {
    trace::TopkRow row = r->topk(q);
    for (int64_t h = 2; h < 4; ++h)
      for (int64_t i = 0; i < k; ++i) {
        int32_t j = row.index[size_t((2 * H + h) * k + i)];
        if (j >= 0) last_q[size_t(j)] = std::max(last_q[size_t(j)], q);
      }
  }
  for (int64_t h = 0; h < T; ++h) {
    int64_t n = 0;
    for (int64_t t = 0; t + h < T; ++t) n += last_q[size_t(t)] >= t + h;
    REQUIRE(c.attended[size_t(h)] == Approx(double(n) / double(T - h)));
  }
  CHECK(c.attended[0] > 0.0);
  // The all-heads map at one horizon agrees with the per-head curve.
  std::vector<double> at = analysis::survival_at(analysis::AllLifetimes::read(*r), fed, 20);
  CHECK(at[size_t(2 * spec.kv_heads + 1)] == Approx(c.held[20]));
}

TEST_CASE("trace diff counts tokens kept by one policy and not the other") {
  trace::SyntheticSpec a = test::small_spec(), b = test::small_spec();
  b.window = 8;
  auto ra = trace::TraceReader::open(test::write_trace(a, "a.h5"));
  auto rb = trace::TraceReader::open(test::write_trace(b, "b.h5"));
  REQUIRE_NOTHROW(analysis::check_comparable(*ra, *rb));
  auto la = analysis::AllLifetimes::read(*ra), lb = analysis::AllLifetimes::read(*rb);
  const int64_t step = 12;
  auto heads = analysis::diff_heads(la, lb, step, step);
  for (int l = 0; l < a.layers; ++l)
    for (int k = 0; k < a.kv_heads; ++k) {
      int only_a = 0, only_b = 0, both = 0;
      for (int64_t t = 0; t < ra->n_tokens(); ++t) {
        bool ha = truth_held(a, l, k, t, step), hb = truth_held(b, l, k, t, step);
        only_a += ha && !hb;
        only_b += hb && !ha;
        both += ha && hb;
      }
      const auto& d = heads[size_t(l * a.kv_heads + k)];
      REQUIRE(d.only_a == only_a);
      REQUIRE(d.only_b == only_b);
      REQUIRE(d.both == both);
      CHECK(only_a == 8);  // a's window is 8 tokens longer than b's at every head
    }
  trace::SyntheticSpec other = test::small_spec();
  other.kv_heads = 2;
  auto rc = trace::TraceReader::open(test::write_trace(other, "c.h5"));
  CHECK_THROWS_WITH(analysis::check_comparable(*ra, *rc), Catch::Contains("kv heads"));
}

TEST_CASE("a span followed over the steps: shares held by one trace only, per head") {
  trace::SyntheticSpec a = test::small_spec(), b = test::small_spec();
  b.window = 8;
  auto ra = trace::TraceReader::open(test::write_trace(a, "a.h5"));
  auto rb = trace::TraceReader::open(test::write_trace(b, "b.h5"));
  auto la = analysis::AllLifetimes::read(*ra), lb = analysis::AllLifetimes::read(*rb);
  // Tokens 30..45 (A's window of 16 reaches them before B's of 8 does) and
  // one past both traces, which neither holds.
  std::vector<int64_t> span;
  for (int64_t t = 30; t < 46; ++t) span.push_back(t);
  span.push_back(ra->n_tokens() + 5);
  std::vector<int64_t> step_b(size_t(ra->n_steps()));
  for (int64_t s = 0; s < ra->n_steps(); ++s) step_b[size_t(s)] = s;
  const analysis::SpanDiff d = analysis::diff_span(la, lb, span, step_b);
  REQUIRE(d.heads == a.layers * a.kv_heads);
  REQUIRE(d.steps == ra->n_steps());
  double most_a = 0;
  for (int l = 0; l < a.layers; ++l)
    for (int k = 0; k < a.kv_heads; ++k)
      for (int64_t s = 0; s < d.steps; ++s) {
        int only_a = 0, only_b = 0;
        for (int64_t t : span) {
          if (t >= ra->n_tokens()) continue;
          bool ha = truth_held(a, l, k, t, s), hb = truth_held(b, l, k, t, s);
          only_a += ha && !hb;
          only_b += hb && !ha;
        }
        const int64_t h = l * a.kv_heads + k;
        REQUIRE(d.at(d.only_a, h, s) == Approx(double(only_a) / double(span.size())));
        REQUIRE(d.at(d.only_b, h, s) == Approx(double(only_b) / double(span.size())));
        most_a = std::max<double>(most_a, d.at(d.only_a, h, s));
      }
  CHECK(most_a > 0.2);  // the longer window holds some of the span longer
  CHECK(analysis::diff_span(la, lb, {}, step_b).only_a ==
        std::vector<float>(size_t(d.heads * d.steps), 0.f));
}

TEST_CASE("Perfetto JSON has one async span per admitted token and occupancy counters") {
  trace::SyntheticSpec spec = test::small_spec();
  auto r = trace::TraceReader::open(test::write_trace(spec));
  std::ostringstream out;
  analysis::PerfettoOptions o;
  o.layers = {0};
  int64_t n = analysis::write_perfetto_json(*r, o, out);
  nlohmann::json j = nlohmann::json::parse(out.str());
  const auto& ev = j["traceEvents"];
  REQUIRE(int64_t(ev.size()) == n);
  int begins = 0, ends = 0, counters = 0;
  int64_t evict_ts = -1;
  for (const auto& e : ev) {
    std::string ph = e["ph"];
    begins += ph == "b";
    ends += ph == "e";
    counters += ph == "C";
    if (ph == "e" && e["tid"] == 3 && e["name"].get<std::string>().rfind("t30 ", 0) == 0)
      evict_ts = e["ts"];
  }
  CHECK(begins == spec.kv_heads * r->n_tokens());  // every token is admitted by every head
  CHECK(ends == begins);
  CHECK(counters == spec.kv_heads * r->n_steps());
  CHECK(evict_ts == 7 * 1000);  // token 30 leaves kv head 2 at step 7 (1 ms per step)
}

TEST_CASE(
    "the LOD cache holds the pooled map halved level by level and goes stale with the trace") {
  trace::SyntheticSpec spec = test::lod_spec();
  std::string path = test::write_trace(spec);
  auto r = trace::TraceReader::open(path);
  std::string cache = analysis::AttentionLod::default_cache_path(path);
  CHECK(cache == path + ".lod");
  CHECK_FALSE(analysis::AttentionLod::open(*r, cache));
  int64_t progress_calls = 0;
  auto lod = analysis::AttentionLod::build(*r, cache, [&](int64_t, int64_t) { ++progress_calls; });
  REQUIRE(lod);
  CHECK(progress_calls == spec.layers * spec.heads);
  REQUIRE(lod->n_levels() == 3);  // 64 -> 32 -> 16 -> 8
  CHECK(lod->level_rows(1) == 32);
  CHECK(lod->level_cols(3) == 8);
  // Levels 2 and 3 are stored, level 1 (a quarter of level 0) is not: the
  // cache is at most 1/12 of level 0's cells (two stats, 2 bytes each) plus
  // its header and metrics.
  REQUIRE(lod->first_level() == 2);
  CHECK_THROWS_WITH(lod->whole(0, 0, 1), Catch::Contains("not in the cache"));
  const int64_t maps = spec.layers * spec.heads, level0_bytes = maps * 64 * 64 * 2 * 2;
  CHECK(int64_t(std::filesystem::file_size(cache)) <=
        level0_bytes / 12 + maps * analysis::kMetricCount * 4 + 4096);
  for (int l = 0; l < spec.layers; ++l)
    for (int h = 0; h < spec.heads; ++h) {
      analysis::AttentionGrid level0 = analysis::read_level0(*r, l, h, 0, 64, 0, 64);
      analysis::AttentionGrid want = analysis::downsample(level0);
      for (int level = 1; level <= 3; ++level) {
        if (level > 1) want = analysis::downsample(want);
        if (level < lod->first_level()) continue;
        analysis::AttentionGrid got = lod->whole(l, h, level);
        REQUIRE(got.max.size() == want.max.size());
        for (size_t i = 0; i < got.max.size(); ++i) {
          REQUIRE(got.max[i] == Approx(want.max[i]).epsilon(2e-3).margin(1e-6));
          REQUIRE(got.mean[i] == Approx(want.mean[i]).epsilon(2e-3).margin(1e-6));
        }
      }
      std::vector<float> m = analysis::head_metrics(level0);
      CHECK(lod->metric(l, h, analysis::HeadMetric::SinkMass) == Approx(m[0]));
      CHECK(m[0] > 0.0f);
      CHECK(m[0] < 1.0f);
    }
  // A window of a cached level is the same cells as the whole level.
  analysis::AttentionGrid whole = lod->whole(1, 3, 2), part = lod->window(1, 3, 2, 4, 9, 2, 7);
  CHECK(part.mean[size_t(1 * part.cols() + 2)] == whole.mean[size_t(5 * whole.cols() + 4)]);
  // The view picks the level that fits the pixels, from the cache or not.
  analysis::AttentionGrid via_cache =
      analysis::attention_view(*r, lod.get(), 0, 1, 0, 64, 0, 64, 20, 20);
  analysis::AttentionGrid direct =
      analysis::attention_view(*r, nullptr, 0, 1, 0, 64, 0, 64, 20, 20);
  CHECK(via_cache.level == 2);
  CHECK(direct.level == 2);
  CHECK(via_cache.mean[7] == Approx(direct.mean[7]).epsilon(2e-3));
  // Level 1, not cached, is read from the trace and halved: the same cells.
  analysis::AttentionGrid level1 =
      analysis::attention_view(*r, lod.get(), 0, 1, 0, 64, 0, 64, 40, 40);
  REQUIRE(level1.level == 1);
  const analysis::AttentionGrid want1 =
      analysis::downsample(analysis::read_level0(*r, 0, 1, 0, 64, 0, 64));
  CHECK(level1.mean == want1.mean);
  // Touching the trace makes the cache stale.
  lod.reset();
  REQUIRE(analysis::AttentionLod::open(*r, cache));
  struct utimbuf times {
    1000000, 1000000
  };
  REQUIRE(utime(path.c_str(), &times) == 0);
  CHECK_FALSE(analysis::AttentionLod::open(*r, cache));
}

TEST_CASE("a LOD build hands each head's thumbnail and metrics over as it finishes it") {
  trace::SyntheticSpec spec = test::lod_spec();
  std::string path = test::write_trace(spec);
  auto r = trace::TraceReader::open(path);
  std::string cache = analysis::AttentionLod::default_cache_path(path);
  std::map<std::pair<int, int>, std::pair<analysis::AttentionGrid, std::vector<float>>> seen;
  auto lod = analysis::AttentionLod::build(
      *r, cache, {}, nullptr,
      [&](int l, int h, const analysis::AttentionGrid& g, const std::vector<float>& m) {
        seen[{l, h}] = {g, m};
      });
  REQUIRE(lod);
  REQUIRE(int64_t(seen.size()) == spec.layers * spec.heads);
  const int level = lod->level_for_side(analysis::kThumbnailSide);
  for (const auto& [key, value] : seen) {
    const analysis::AttentionGrid want = lod->whole(key.first, key.second, level);
    const analysis::AttentionGrid& got = value.first;
    REQUIRE(got.level == level);
    REQUIRE(got.mean.size() == want.mean.size());
    for (size_t i = 0; i < got.mean.size(); ++i)  // the cache rounds to float16
      REQUIRE(got.mean[i] == Approx(want.mean[i]).epsilon(2e-3).margin(1e-6));
    REQUIRE(value.second.size() == size_t(analysis::kMetricCount));
    for (int m = 0; m < analysis::kMetricCount; ++m)
      CHECK(value.second[size_t(m)] == lod->metric(key.first, key.second, analysis::HeadMetric(m)));
  }
}

TEST_CASE("the LOD cache is refused for a trace still being written") {
  trace::SyntheticSpec spec = test::lod_spec();
  std::string path = test::temp_dir() + "/live.h5";
  trace::write_synthetic_trace(path, spec, {}, 5);  // stops after 5 steps, never closed
  auto r = trace::TraceReader::open(path);
  REQUIRE_FALSE(r->complete());
  CHECK_THROWS_WITH(analysis::AttentionLod::build(*r, path + ".lod"),
                    Catch::Contains("/run/complete") && Catch::Contains("still being written"));
  CHECK_FALSE(analysis::AttentionLod::open(*r, path + ".lod"));
}
