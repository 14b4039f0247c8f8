// How the cache stored its rows (format minor version 8): /run kv_dtype and
// tier_formats round-trip, bad values are refused naming the attribute, and
// a 1.7 trace (neither attribute) opens as an fp32 cache with unrecorded
// formats.
#include <catch2/catch.hpp>

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

// A two-tier (bf16 hot, int4 warm) trace with one prefill step of 2 tokens.
std::string write_stored(const std::string& path) {
  RunInfo run = test::tiny_run(1, 1);
  run.model.kv_dtype = "bf16";
  run.tier_names = {"hot", "warm"};
  run.tier_attended = {1, 1};
  run.tier_formats = {"bfloat16", "int4"};
  CaptureLayout layout;
  layout.max_tokens = 4;
  auto w = TraceWriter::create(path, run, layout, {});
  StepData pre;
  pre.step.kind = StepKind::Prefill;
  pre.step.n_tokens = 2;
  for (int32_t t = 0; t < 2; ++t) {
    pre.tokens.push_back({10 + t, t, TokenRole::Prompt, 0, -1, "p"});
    pre.events.push_back({0, 0, 0, t, EventKind::Admit, 0.0f, 0, kNoTier, 0});
  }
  pre.occupancy = {2, 0};
  pre.step.entries = 2;
  w->append_step(pre);
  w->close({});
  return path;
}

}  // namespace

TEST_CASE("the cache's storage formats round-trip", "[trace][storage]") {
  auto r = TraceReader::open(write_stored(test::temp_dir() + "/stored.kvtrace.h5"));
  CHECK(r->format_minor_version() == kFormatMinorVersion);
  CHECK(r->run().model.kv_dtype == "bf16");
  CHECK(r->run().tier_formats == std::vector<std::string>{"bfloat16", "int4"});
  CHECK(validate_trace(r->path()).ok());
}

TEST_CASE("a 1.7 trace (no storage formats) opens as an fp32 cache", "[trace][storage]") {
  const std::string p = write_stored(test::temp_dir() + "/old17.kvtrace.h5");
  {
    Edit e(p);
    e.remove_attr("/run", "kv_dtype");
    e.remove_attr("/run", "tier_formats");
    e.set_i64_attr("/", "minor_version", 7);
  }
  auto r = TraceReader::open(p);
  CHECK(r->run().model.kv_dtype == "fp32");
  CHECK(r->run().tier_formats.empty());
  CHECK(validate_trace(p).ok());
}

TEST_CASE("bad storage formats are refused naming the attribute", "[trace][storage]") {
  const std::string dir = test::temp_dir();
  SECTION("an unknown kv_dtype") {
    const std::string p = write_stored(dir + "/bad-kv.kvtrace.h5");
    Edit(p).set_string_attr("/run", "kv_dtype", "int3");
    CHECK(has_violation(validate_trace(p), "/run attribute kv_dtype",
                        "is \"int3\" (expected fp32, bf16 or fp16)"));
  }
  SECTION("one format for two tiers") {
    const std::string p = write_stored(dir + "/bad-formats.kvtrace.h5");
    Edit(p).set_strings_attr("/run", "tier_formats", {"bfloat16"});
    CHECK(has_violation(validate_trace(p), "/run attribute tier_formats",
                        "has 1 formats (expected one per tier_names entry: 2)"));
  }
  SECTION("a format that is none") {
    const std::string p = write_stored(dir + "/bad-name.kvtrace.h5");
    Edit(p).set_strings_attr("/run", "tier_formats", {"bfloat16", "fp8"});
    CHECK(has_violation(validate_trace(p), "/run attribute tier_formats",
                        "holds \"fp8\" (expected float32, bfloat16, float16 or int4)"));
  }
  SECTION("a 1.8 trace without kv_dtype") {
    const std::string p = write_stored(dir + "/missing.kvtrace.h5");
    Edit(p).remove_attr("/run", "kv_dtype");
    CHECK(
        has_violation(validate_trace(p), "/run attribute kv_dtype", "missing (expected a string)"));
  }
}
