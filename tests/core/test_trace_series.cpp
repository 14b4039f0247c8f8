// /series (format minor version 2): one value per step and (layer, kv head)
// that a policy records about itself, e.g. KVpop's cutoff. Round trip through
// the writer and reader with NaN holes, traces without series (older minor
// versions read as an empty list), and the checks of writer and validator.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <cmath>
#include <limits>

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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kL = 2, kK = 2;

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i])) return false;
  return true;
}

// The smallest capture a writer takes: 2 layers, 2 kv heads, one token per
// step, no events, and the series the layout is given.
struct Tiny {
  RunInfo run;
  CaptureLayout layout;

  explicit Tiny(std::vector<SeriesSpec> series) {
    run = test::tiny_run(kL, kK);
    layout.max_tokens = 16;
    layout.series = std::move(series);
  }

  static StepData step(int32_t s, std::vector<float> series) {
    StepData sd;
    sd.step.first_token = s;
    sd.step.n_tokens = 1;
    sd.tokens.push_back({s % 100, s, TokenRole::Prompt, s, -1, "t"});
    sd.occupancy.assign(size_t(kL * kK), 0);
    sd.series = std::move(series);
    return sd;
  }

  std::string write(const std::string& path, const std::vector<std::vector<float>>& steps) const {
    auto w = TraceWriter::create(path, run, layout);
    for (size_t s = 0; s < steps.size(); ++s) w->append_step(step(int32_t(s), steps[s]));
    w->close({});
    return path;
  }
};

std::vector<SeriesSpec> two_series() {
  return {{"cutoff", "effective score of the k-th best entry", "score"},
          {"kept", "entries above the cutoff", "entries"}};
}

// Steps of two series over [layer][kv head]: step 0 records nothing, step 1
// leaves holes, step 2 records every head.
std::vector<std::vector<float>> steps_with_holes() {
  return {{}, {0.5f, kNaN, kNaN, -2.0f, 3, 3, kNaN, 4}, {1.5f, 2.5f, 3.5f, 4.5f, 10, 11, 12, 13}};
}

void expect_open_error(const std::string& path, const std::string& field,
                       const std::string& message) {
  try {
    TraceReader::open(path);
    FAIL("opened " << path);
  } catch (const TraceError& e) {
    CHECK(e.field() == field);
    CHECK(std::string(e.what()) == path + ": " + field + ": " + message);
  }
}

}  // namespace

TEST_CASE("series values round-trip with NaN where nothing was recorded", "[trace][series]") {
  const std::string path =
      Tiny(two_series()).write(test::temp_dir() + "/series.kvtrace.h5", steps_with_holes());
  auto r = TraceReader::open(path);
  CHECK(r->format_minor_version() == kFormatMinorVersion);
  REQUIRE(r->series().size() == 2);
  CHECK(r->series()[0].name == "cutoff");
  CHECK(r->series()[0].meaning == "effective score of the k-th best entry");
  CHECK(r->series()[1].units == "entries");
  CHECK(r->series_index("kept") == 1);
  CHECK(r->series_index("nope") == -1);

  const std::vector<std::vector<float>> want = steps_with_holes();
  for (int i = 0; i < 2; ++i) {
    std::vector<float> all(size_t(kL * kK * 3), kNaN);
    for (size_t s = 1; s < 3; ++s)
      std::copy_n(want[s].begin() + i * kL * kK, kL * kK, all.begin() + long(s) * kL * kK);
    CHECK(same(r->series_values(i, 0, 3), all));
    CHECK(same(r->series_values(i, 1, 2),
               std::vector<float>(all.begin() + kL * kK, all.begin() + 2 * kL * kK)));
  }
  // One head over steps: series 1, layer 1, kv head 0.
  CHECK(same(r->series_head(1, 1, 0, 0, 3), {kNaN, kNaN, 12}));
  CHECK(same(r->series_head(0, 0, 1, 1, 3), {kNaN, 2.5f}));
  CHECK_THROWS_WITH(r->series_values(2, 0, 1), Catch::Contains("/series: no series 2"));
  CHECK_THROWS_AS(r->series_values(0, 0, 4), TraceError);
  CHECK_THROWS_AS(r->series_head(0, 2, 0, 0, 1), TraceError);

  ValidationReport report = validate_trace(path);
  for (const Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
}

TEST_CASE("the writer refuses series values of the wrong size and bad series names",
          "[trace][series]") {
  const std::string dir = test::temp_dir();
  Tiny tiny(two_series());
  auto w = TraceWriter::create(dir + "/size.kvtrace.h5", tiny.run, tiny.layout);
  CHECK_THROWS_WITH(w->append_step(Tiny::step(0, {1, 2, 3})),
                    Catch::EndsWith("/series: step carries 3 values, expected series * L * K = 8 "
                                    "(or none)"));
  Tiny bad({{"a b", "", "1"}});
  CHECK_THROWS_WITH(TraceWriter::create(dir + "/name.kvtrace.h5", bad.run, bad.layout),
                    Catch::EndsWith("/series/a b: series names must match [A-Za-z0-9_-]{1,64}"));
  Tiny twice({{"cutoff", "", "1"}, {"cutoff", "", "1"}});
  CHECK_THROWS_WITH(
      TraceWriter::create(dir + "/twice.kvtrace.h5", twice.run, twice.layout),
      Catch::EndsWith("/series/cutoff: declared twice (series names must be unique)"));
}

TEST_CASE("a trace without series has no /series and lists none, as older minor versions",
          "[trace][series]") {
  const std::string path = Tiny({}).write(test::temp_dir() + "/none.kvtrace.h5", {{}, {}});
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    CHECK(H5Lexists(f, "/series", H5P_DEFAULT) == 0);
    H5Fclose(f);
  }
  // Minor versions 0 and 1 wrote no /series: such a trace reads as one without series.
  for (int64_t minor : {1, 0}) {
    Edit(path).set_i64_attr("/", "minor_version", minor);
    auto r = TraceReader::open(path);
    CHECK(r->format_minor_version() == minor);
    CHECK(r->series().empty());
    CHECK(r->series_index("cutoff") == -1);
    CHECK_THROWS_WITH(r->series_values(0, 0, 1), Catch::Contains("/series: no series 0"));
    CHECK(validate_trace(path).ok());
  }
}

TEST_CASE("the validator names a series value dataset of the wrong type or shape",
          "[trace][series]") {
  const std::string dir = test::temp_dir();
  const std::string field = "/series/cutoff/value";
  SECTION("a head too many") {
    const std::string p = Tiny(two_series()).write(dir + "/k.kvtrace.h5", steps_with_holes());
    Edit(p).replace_dataset(field.c_str(), H5T_IEEE_F32LE, {3, kL, kK + 1});
    CHECK(has_violation(validate_trace(p), field, "axis 2 (K) has length 3 (expected 2)"));
  }
  SECTION("rows for steps that are not there") {
    const std::string p = Tiny(two_series()).write(dir + "/s.kvtrace.h5", steps_with_holes());
    Edit(p).replace_dataset(field.c_str(), H5T_IEEE_F32LE, {5, kL, kK});
    CHECK(has_violation(validate_trace(p), field, "axis 0 (S) has length 5 (expected 3)"));
  }
  SECTION("rank 2") {
    const std::string p = Tiny(two_series()).write(dir + "/r.kvtrace.h5", steps_with_holes());
    Edit(p).replace_dataset(field.c_str(), H5T_IEEE_F32LE, {3, kL * kK});
    CHECK(has_violation(validate_trace(p), field, "has rank 2 (expected 3, axes [S, L, K])"));
    CHECK_THROWS_WITH(TraceReader::open(p)->series_values(0, 0, 1),
                      Catch::Contains(field + ": has rank 2 (expected 3)"));
  }
  SECTION("integers") {
    const std::string p = Tiny(two_series()).write(dir + "/t.kvtrace.h5", steps_with_holes());
    Edit(p).replace_dataset(field.c_str(), H5T_STD_I32LE, {3, kL, kK});
    CHECK(has_violation(validate_trace(p), field, "element type is int32 (expected float32)"));
    CHECK_THROWS_WITH(TraceReader::open(p)->series_head(0, 0, 0, 0, 1),
                      Catch::Contains(field + ": element type is int32 (expected float32)"));
  }
}

TEST_CASE("/series order names exactly the series groups", "[trace][series]") {
  const std::string dir = test::temp_dir();
  const std::string order = "/series attribute order";
  SECTION("a name without a group") {
    const std::string p = Tiny(two_series()).write(dir + "/ghost.kvtrace.h5", steps_with_holes());
    Edit(p).set_strings_attr("/series", "order", {"cutoff", "kept", "ghost"});
    const std::string message = "names ghost, which is not a group under /series";
    expect_open_error(p, order, message);
    CHECK(has_violation(validate_trace(p), order, message));
  }
  SECTION("a group deleted") {
    const std::string p = Tiny(two_series()).write(dir + "/deleted.kvtrace.h5", steps_with_holes());
    Edit(p).remove("/series/kept");
    expect_open_error(p, order, "names kept, which is not a group under /series");
  }
  SECTION("a group left out") {
    const std::string p = Tiny(two_series()).write(dir + "/left.kvtrace.h5", steps_with_holes());
    Edit(p).set_strings_attr("/series", "order", {"kept"});
    expect_open_error(p, order, "does not name /series/cutoff (expected every series)");
  }
  SECTION("order follows the writer, not HDF5's name order") {
    const std::string p = Tiny({{"zeta", "", "1"}, {"alpha", "", "1"}})
                              .write(dir + "/order.kvtrace.h5", {{1, 2, 3, 4, 5, 6, 7, 8}});
    auto r = TraceReader::open(p);
    REQUIRE(r->series().size() == 2);
    CHECK(r->series()[0].name == "zeta");
    CHECK(same(r->series_values(1, 0, 1), {5, 6, 7, 8}));
  }
}
