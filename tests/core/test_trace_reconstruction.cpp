// Context-reconstruction steps (format minor version 5): step kind 2 feeds no
// sequence token, its tokens are its rows of /reconstruction. Round trip
// through writer and reader, a 1.4 trace (no such step, no table) still
// valid, the writer's and the validator's refusals.
#include <catch2/catch.hpp>

#include "core/trace/error.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "core/trace/writer.h"
#include "tests/core/trace_checks.h"
#include "tests/core/trace_edit.h"
#include "tests/core/trace_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using namespace kvscope::trace;
using kvscope::test::Edit;
using kvscope::test::has_violation;

namespace {

constexpr int64_t kL = 2, kK = 2;

struct Run {
  RunInfo run;
  CaptureLayout layout;

  Run() {
    run = test::tiny_run(kL, kK);
    layout.max_tokens = 16;
  }

  // Step 0: prefill of tokens 0..3; step 1: reconstruction of 5 tokens at
  // positions 4..8 (evicting token 1 of head (0, 0)); steps 2, 3: decode
  // tokens 4 and 5.
  static std::vector<StepData> steps(bool with_reconstruction = true) {
    std::vector<StepData> out;
    StepData pre;
    pre.step.kind = StepKind::Prefill;
    pre.step.n_tokens = 4;
    for (int32_t t = 0; t < 4; ++t)
      pre.tokens.push_back({10 + t, t, TokenRole::Prompt, 0, -1, "p"});
    for (int16_t l = 0; l < kL; ++l)
      for (int16_t h = 0; h < kK; ++h)
        for (int32_t t = 0; t < 4; ++t)
          pre.events.push_back({0, l, h, t, EventKind::Admit, 0.0f, 0, kNoTier, 0});
    pre.occupancy.assign(size_t(kL * kK), 4);
    out.push_back(pre);
    if (with_reconstruction) {
      StepData rec;
      rec.step.kind = StepKind::Reconstruction;
      rec.step.first_token = 4;
      for (int32_t i = 0; i < 5; ++i) rec.reconstruction.push_back({1, 4 + i, 50 + i});
      rec.events.push_back({1, 0, 0, 1, EventKind::Evict, 0.5f, 0, 0, kNoTier});
      rec.occupancy.assign(size_t(kL * kK), 4);
      rec.occupancy[0] = 3;
      out.push_back(rec);
    }
    for (int32_t t = 4; t < 6; ++t) {
      StepData dec;
      const int32_t s = int32_t(out.size());
      dec.step.kind = StepKind::Decode;
      dec.step.first_token = t;
      dec.step.n_tokens = 1;
      dec.tokens.push_back({20 + t, t, TokenRole::Generated, s, -1, "g"});
      for (int16_t l = 0; l < kL; ++l)
        for (int16_t h = 0; h < kK; ++h)
          dec.events.push_back({s, l, h, t, EventKind::Admit, 0.0f, 0, kNoTier, 0});
      dec.occupancy.assign(size_t(kL * kK), t + 1);
      if (with_reconstruction) dec.occupancy[0] = t;
      out.push_back(dec);
    }
    return out;
  }

  std::string write(const std::string& path, const std::vector<StepData>& steps) const {
    auto w = TraceWriter::create(path, run, layout, {});
    for (StepData sd : steps) {
      sd.step.entries = 0;
      for (int32_t n : sd.occupancy) sd.step.entries += n;
      w->append_step(sd);
    }
    w->close({});
    return path;
  }
};

void check_valid(const std::string& path) {
  ValidationReport report = validate_trace(path);
  for (const Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
}

}  // namespace

TEST_CASE("reconstruction steps round-trip", "[trace][reconstruction]") {
  const std::string path =
      Run().write(test::temp_dir() + "/reconstruction.kvtrace.h5", Run::steps());
  auto r = TraceReader::open(path);
  CHECK(r->format_minor_version() == kFormatMinorVersion);
  CHECK(r->n_steps() == 4);
  CHECK(r->n_tokens() == 6);
  const std::vector<StepRecord> steps = r->steps(0, 4);
  CHECK(steps[1].kind == StepKind::Reconstruction);
  CHECK(steps[1].n_tokens == 0);
  CHECK(steps[1].first_token == 4);
  CHECK(steps[2].kind == StepKind::Decode);
  CHECK(std::string(step_kind_name(steps[1].kind)) == "reconstruction");
  const std::vector<ReconstructionRow> rows = r->reconstruction_tokens();
  REQUIRE(rows.size() == 5);
  CHECK(r->n_reconstruction_tokens() == 5);
  for (int32_t i = 0; i < 5; ++i) {
    CHECK(rows[size_t(i)].step == 1);
    CHECK(rows[size_t(i)].position == 4 + i);
    CHECK(rows[size_t(i)].id == 50 + i);
  }
  check_valid(path);
}

TEST_CASE("a 1.4 trace (no reconstruction) stays valid, a kind-2 step in one is not",
          "[trace][reconstruction]") {
  const std::string dir = test::temp_dir();
  const std::string old = Run().write(dir + "/old14.kvtrace.h5", Run::steps(false));
  {
    Edit e(old);
    e.remove("/reconstruction");
    e.set_i64_attr("/", "minor_version", 4);
  }
  auto r = TraceReader::open(old);
  CHECK(r->format_minor_version() == 4);
  CHECK(r->n_reconstruction_tokens() == 0);
  CHECK(r->reconstruction_tokens().empty());
  check_valid(old);
  const std::string bad = Run().write(dir + "/bad14.kvtrace.h5", Run::steps());
  {
    Edit e(bad);
    e.remove("/reconstruction");
    e.set_i64_attr("/", "minor_version", 4);
  }
  CHECK(has_violation(validate_trace(bad), "/steps/kind",
                      "1 value(s) outside [0, 2); first at row 1 = 2"));
}

TEST_CASE("the validator checks every reconstruction row", "[trace][reconstruction]") {
  const std::string dir = test::temp_dir();
  SECTION("a row naming a decode step") {
    const std::string p = Run().write(dir + "/r-step.kvtrace.h5", Run::steps());
    Edit(p).write_i64("/reconstruction/step", 4, 2);
    CHECK(has_violation(validate_trace(p), "/reconstruction/step",
                        "row 4 names step 2, which is no reconstruction step"));
  }
  SECTION("a position out of order") {
    const std::string p = Run().write(dir + "/r-pos.kvtrace.h5", Run::steps());
    Edit(p).write_i64("/reconstruction/position", 2, 3);
    CHECK(has_violation(validate_trace(p), "/reconstruction/position",
                        "row 2 is at position 3 (expected 6)"));
  }
  SECTION("an id outside the vocabulary") {
    const std::string p = Run().write(dir + "/r-id.kvtrace.h5", Run::steps());
    Edit(p).write_i64("/reconstruction/id", 0, 100);
    CHECK(has_violation(validate_trace(p), "/reconstruction/id",
                        "1 value(s) outside [0, 100); first at row 0 = 100"));
  }
}

TEST_CASE("the writer refuses reconstruction steps that feed sequence tokens",
          "[trace][reconstruction]") {
  std::vector<StepData> steps = Run::steps();
  steps[1].step.n_tokens = 1;
  steps[1].tokens.push_back({5, 4, TokenRole::Prompt, 1, -1, "x"});
  CHECK_THROWS_AS(Run().write(test::temp_dir() + "/r-refused.kvtrace.h5", steps), TraceError);
  steps = Run::steps();
  steps[2].reconstruction.push_back({2, 4, 7});
  CHECK_THROWS_AS(Run().write(test::temp_dir() + "/r-refused2.kvtrace.h5", steps), TraceError);
}
