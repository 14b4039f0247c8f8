// Each layer's type (format minor version 9): /run layer_window and
// layer_ffn round-trip, a 1.8 trace (neither attribute) opens with every
// layer global and dense, and bad values are refused naming the attribute.
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

// Three layers: a sliding window of 6 on the first, MoE on the last two.
std::string write_layered(const std::string& path, bool typed = true) {
  RunInfo run = test::tiny_run(3, 1);
  if (typed) {
    run.model.layer_window = {6, 0, 0};
    run.model.layer_ffn = {"dense", "moe", "moe"};
  }
  CaptureLayout layout;
  layout.max_tokens = 4;
  auto w = TraceWriter::create(path, run, layout, {});
  StepData pre;
  pre.step.kind = StepKind::Prefill;
  pre.step.n_tokens = 1;
  pre.tokens.push_back({10, 0, TokenRole::Prompt, 0, -1, "p"});
  for (int16_t l = 0; l < 3; ++l)
    pre.events.push_back({0, l, 0, 0, EventKind::Admit, 0.0f, 0, kNoTier, 0});
  pre.occupancy = {1, 1, 1};  // L*K*R: one entry per layer
  pre.step.entries = 3;
  w->append_step(pre);
  w->close({});
  return path;
}

}  // namespace

TEST_CASE("layer types round-trip", "[trace][layers]") {
  auto r = TraceReader::open(write_layered(test::temp_dir() + "/layers.kvtrace.h5"));
  CHECK(r->run().model.layer_window == std::vector<int64_t>{6, 0, 0});
  CHECK(r->run().model.layer_ffn == std::vector<std::string>{"dense", "moe", "moe"});
  CHECK(validate_trace(r->path()).ok());
}

TEST_CASE("a run without layer types is written global and dense", "[trace][layers]") {
  auto r = TraceReader::open(write_layered(test::temp_dir() + "/untyped.kvtrace.h5", false));
  CHECK(r->run().model.layer_window == std::vector<int64_t>(3, 0));
  CHECK(r->run().model.layer_ffn == std::vector<std::string>(3, "dense"));
}

TEST_CASE("a 1.8 trace (no layer types) opens with every layer global and dense",
          "[trace][layers]") {
  const std::string p = write_layered(test::temp_dir() + "/old18.kvtrace.h5");
  {
    Edit e(p);
    e.remove_attr("/run", "layer_window");
    e.remove_attr("/run", "layer_ffn");
    e.set_i64_attr("/", "minor_version", 8);
  }
  auto r = TraceReader::open(p);
  CHECK(r->run().model.layer_window == std::vector<int64_t>(3, 0));
  CHECK(r->run().model.layer_ffn == std::vector<std::string>(3, "dense"));
  CHECK(validate_trace(p).ok());
}

TEST_CASE("bad layer types are refused naming the attribute", "[trace][layers]") {
  const std::string dir = test::temp_dir();
  SECTION("a window per layer missing") {
    const std::string p = write_layered(dir + "/bad-count.kvtrace.h5");
    const std::vector<int64_t> two = {6, 0};
    Edit(p).replace_1d_attr("/run", "layer_window", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, two.data());
    CHECK(has_violation(validate_trace(p), "/run attribute layer_window",
                        "has 2 windows (expected one per layer: 3)"));
  }
  SECTION("a negative window") {
    const std::string p = write_layered(dir + "/bad-window.kvtrace.h5");
    const std::vector<int64_t> w = {6, -1, 0};
    Edit(p).replace_1d_attr("/run", "layer_window", H5T_STD_I64LE, H5T_NATIVE_INT64, 3, w.data());
    CHECK(has_violation(validate_trace(p), "/run attribute layer_window",
                        "holds -1 (expected 0 or a positive window)"));
  }
  SECTION("an FFN kind that is none") {
    const std::string p = write_layered(dir + "/bad-ffn.kvtrace.h5");
    Edit(p).set_strings_attr("/run", "layer_ffn", {"dense", "sparse", "moe"});
    CHECK(has_violation(validate_trace(p), "/run attribute layer_ffn",
                        "holds \"sparse\" (expected dense or moe)"));
  }
  SECTION("a 1.9 trace without layer_ffn") {
    const std::string p = write_layered(dir + "/missing.kvtrace.h5");
    Edit(p).remove_attr("/run", "layer_ffn");
    CHECK(has_violation(validate_trace(p), "/run attribute layer_ffn",
                        "missing (expected a string)"));
  }
}
