// The task score (format minor version 6): /generation/score holds the share
// of the expected answers the generation contains. Round trip, the
// validator's consistency checks against success, and a 1.5 trace (no score)
// still valid with the score derived from success.
#include <catch2/catch.hpp>

#include <cmath>

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

// One prefill step of 3 tokens in a 1-layer, 1-head trace, closed with `summary`.
std::string write_scored(const std::string& path, GenerationSummary summary) {
  CaptureLayout layout;
  layout.max_tokens = 8;
  auto w = TraceWriter::create(path, test::tiny_run(1, 1), layout, {});
  StepData pre;
  pre.step.kind = StepKind::Prefill;
  pre.step.n_tokens = 3;
  for (int32_t t = 0; t < 3; ++t) {
    pre.tokens.push_back({10 + t, t, TokenRole::Prompt, 0, -1, "p"});
    pre.events.push_back({0, 0, 0, t, EventKind::Admit, 0.0f, 0, kNoTier, 0});
  }
  pre.occupancy = {3};
  pre.step.entries = 3;
  w->append_step(pre);
  w->close(summary);
  return path;
}

GenerationSummary outcome(int8_t success, double score) {
  GenerationSummary s;
  s.success = success;
  s.score = score;
  return s;
}

}  // namespace

TEST_CASE("the task score round-trips and is checked against success", "[trace][score]") {
  const std::string dir = test::temp_dir();
  SECTION("a multi-answer task found in part") {
    auto r = TraceReader::open(write_scored(dir + "/partial.kvtrace.h5", outcome(0, 0.75)));
    CHECK(r->format_minor_version() == kFormatMinorVersion);
    CHECK(r->task_success() == 0);
    CHECK(r->task_score() == 0.75);
    CHECK(validate_trace(r->path()).ok());
  }
  SECTION("no task: NaN") {
    auto r = TraceReader::open(write_scored(dir + "/none.kvtrace.h5", GenerationSummary{}));
    CHECK(std::isnan(r->task_score()));
    CHECK(validate_trace(r->path()).ok());
  }
  SECTION("a score of 1 must mean success") {
    const std::string p = write_scored(dir + "/s1.kvtrace.h5", outcome(0, 1.0));
    CHECK(has_violation(validate_trace(p), "/generation/score",
                        "is 1 with success 0 (expected 1 exactly when success is 1)"));
  }
  SECTION("success must mean a score of 1") {
    const std::string p = write_scored(dir + "/s2.kvtrace.h5", outcome(1, 0.5));
    CHECK(has_violation(validate_trace(p), "/generation/score",
                        "is 0.5 with success 1 (expected 1 exactly when success is 1)"));
  }
  SECTION("a score outside 0..1") {
    const std::string p = write_scored(dir + "/s3.kvtrace.h5", outcome(0, 1.5));
    CHECK(has_violation(validate_trace(p), "/generation/score", "is 1.5 (expected 0..1 or NaN)"));
  }
  SECTION("a score without a task outcome") {
    const std::string p = write_scored(dir + "/s4.kvtrace.h5", outcome(-1, 0.0));
    CHECK(has_violation(validate_trace(p), "/generation/score",
                        "is 0 with success -1 (expected NaN exactly when success is -1)"));
  }
}

TEST_CASE("a 1.5 trace (no score) stays valid, its score comes from success", "[trace][score]") {
  const std::string dir = test::temp_dir();
  for (int8_t success : {int8_t(1), int8_t(0), int8_t(-1)}) {
    const std::string p =
        write_scored(dir + "/old15-" + std::to_string(success + 1) + ".kvtrace.h5",
                     outcome(success, success < 0 ? NAN : success));
    {
      Edit e(p);
      e.remove("/generation/score");
      e.set_i64_attr("/", "minor_version", 5);
    }
    auto r = TraceReader::open(p);
    CHECK(r->format_minor_version() == 5);
    if (success < 0)
      CHECK(std::isnan(r->task_score()));
    else
      CHECK(r->task_score() == double(success));
    ValidationReport report = validate_trace(p);
    for (const Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
    CHECK(report.ok());
  }
}
