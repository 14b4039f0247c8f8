// /stalls and /run tier_attended (format minor version 3): reactive fetches of
// entries a policy does not attend, and which tiers its attention reads.
// Round trip through writer and reader, older minor versions (no /stalls, every
// tier attended), the writer's and the validator's refusals, stalls of steps
// an incomplete trace has not committed, synthetic traces and `kvscope info`.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/trace/error.h"
#include "core/trace/reader.h"
#include "core/trace/synthetic.h"
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

// Three tiers like the Salience Forecasting Cache's: hot, warm (attended),
// cold (not attended). One token per step, no events.
struct Tiered {
  RunInfo run;
  CaptureLayout layout;
  TraceWriter::Options options;

  explicit Tiered(std::vector<uint8_t> attended = {1, 1, 0}) {
    run = test::tiny_run(kL, kK);
    run.tier_names = {"hot", "warm", "cold"};
    run.tier_attended = std::move(attended);
    layout.max_tokens = 16;
  }

  static StepData step(int32_t s, std::vector<StallRow> stalls) {
    StepData sd;
    sd.step.first_token = s;
    sd.step.n_tokens = 1;
    sd.tokens.push_back({s % 100, s, TokenRole::Prompt, s, -1, "t"});
    sd.occupancy.assign(size_t(kL * kK * 3), 0);
    sd.stalls = std::move(stalls);
    return sd;
  }

  std::string write(const std::string& path, const std::vector<std::vector<StallRow>>& steps,
                    bool close = true) const {
    auto w = TraceWriter::create(path, run, layout, options);
    for (size_t s = 0; s < steps.size(); ++s) w->append_step(step(int32_t(s), steps[s]));
    if (close) w->close({});
    return path;
  }
};

// Step 0 and 2 wait for nothing, step 1 for two entries, step 3 for one.
std::vector<std::vector<StallRow>> four_steps() {
  return {{}, {{1, 0, 1, 0, 0.0009f, 1}, {1, 1, 0, 1, 0.0021f, 0}}, {}, {{3, 1, 1, 2, 0.5f, -1}}};
}

bool same(const StallRow& a, const StallRow& b) {
  return a.step == b.step && a.layer == b.layer && a.kv_head == b.kv_head && a.token == b.token &&
         a.wait_s == b.wait_s && a.needed == b.needed;
}

bool same(const std::vector<StallRow>& a, const std::vector<StallRow>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

std::vector<StallRow> all_of(const std::vector<std::vector<StallRow>>& steps) {
  std::vector<StallRow> out;
  for (const auto& s : steps) out.insert(out.end(), s.begin(), s.end());
  return out;
}

void check_valid(const std::string& path) {
  ValidationReport report = validate_trace(path);
  for (const Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
}

// What a 1.2 (or older) writer wrote: no /stalls, no /run tier_attended.
void make_older(const std::string& path, int64_t minor) {
  Edit e(path);
  e.remove("/stalls");
  e.remove_attr("/run", "tier_attended");
  e.set_i64_attr("/", "minor_version", minor);
}

}  // namespace

TEST_CASE("stalls and tier attended flags round-trip", "[trace][stalls]") {
  const std::string path = Tiered().write(test::temp_dir() + "/stalls.kvtrace.h5", four_steps());
  auto r = TraceReader::open(path);
  CHECK(r->format_minor_version() == kFormatMinorVersion);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1, 1, 0});
  CHECK(r->n_stalls() == 3);
  CHECK(same(r->stalls(), all_of(four_steps())));
  CHECK(r->stalls_of_step(0).empty());
  CHECK(same(r->stalls_of_step(1), four_steps()[1]));
  CHECK(r->stalls_of_step(2).empty());
  CHECK(same(r->stalls_of_step(3), four_steps()[3]));
  CHECK_THROWS_WITH(r->stalls_of_step(4), Catch::Contains("/stalls/step: step 4 outside [0, 4)"));
  CHECK_THROWS_AS(r->stalls_of_step(-1), TraceError);
  check_valid(path);
}

TEST_CASE("every 1.3 trace holds /stalls, possibly empty, and tier_attended", "[trace][stalls]") {
  Tiered tiered(std::vector<uint8_t>{});  // no flags given: every tier attended
  const std::string path = tiered.write(test::temp_dir() + "/no_stalls.kvtrace.h5", {{}, {}});
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t d = H5Dopen2(f, "/stalls/wait_s", H5P_DEFAULT);
    REQUIRE(d >= 0);
    hid_t space = H5Dget_space(d);
    hsize_t n = 99, max = 0;
    H5Sget_simple_extent_dims(space, &n, &max);
    CHECK(n == 0);
    CHECK(max == H5S_UNLIMITED);
    H5Sclose(space);
    H5Dclose(d);
    CHECK(H5Aexists_by_name(f, "/run", "tier_attended", H5P_DEFAULT) > 0);
    H5Fclose(f);
  }
  auto r = TraceReader::open(path);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1, 1, 1});
  CHECK(r->n_stalls() == 0);
  CHECK(r->stalls().empty());
  CHECK(r->stalls_of_step(1).empty());
  check_valid(path);
}

TEST_CASE("traces of minor versions 0 to 2 read with no stalls and every tier attended",
          "[trace][stalls]") {
  const std::string dir = test::temp_dir();
  for (int64_t minor : {2, 1, 0}) {
    INFO("minor version " << minor);
    const std::string path =
        Tiered().write(dir + "/old" + std::to_string(minor) + ".kvtrace.h5", four_steps());
    make_older(path, minor);
    auto r = TraceReader::open(path);
    CHECK(r->format_minor_version() == minor);
    CHECK(r->tier_attended() == std::vector<uint8_t>{1, 1, 1});
    CHECK(r->n_stalls() == 0);
    CHECK(r->stalls().empty());
    CHECK(r->stalls_of_step(1).empty());
    check_valid(path);
  }
  // A full 1.2 trace (every group, two tiers, series, gates, oracle) as well.
  SyntheticSpec spec = test::small_spec(2, 8);
  spec.cold_attended = false;
  const std::string full = dir + "/old_full.kvtrace.h5";
  write_synthetic_trace(full, spec);
  make_older(full, 2);
  auto r = TraceReader::open(full);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1, 1});
  CHECK(r->stalls().empty());
  CHECK(r->series().size() == 1);
  check_valid(full);
}

TEST_CASE("a 1.3 trace must hold /stalls and tier_attended", "[trace][stalls]") {
  const std::string dir = test::temp_dir();
  SECTION("a stall column deleted") {
    const std::string p = Tiered().write(dir + "/gone.kvtrace.h5", four_steps());
    Edit(p).remove("/stalls/needed");
    CHECK(has_violation(validate_trace(p), "/stalls/needed", "dataset missing"));
    CHECK_THROWS_WITH(TraceReader::open(p)->stalls(),
                      Catch::Contains("/stalls/needed: dataset missing"));
  }
  SECTION("tier_attended deleted") {
    const std::string p = Tiered().write(dir + "/no_flags.kvtrace.h5", four_steps());
    Edit(p).remove_attr("/run", "tier_attended");
    const std::string message = "missing (expected a list of integers)";
    CHECK_THROWS_WITH(TraceReader::open(p),
                      p + ": /run attribute tier_attended: missing (expected a list of integers)");
    CHECK(has_violation(validate_trace(p), "/run attribute tier_attended", message));
  }
  SECTION("a flag per tier") {
    const std::string p = Tiered().write(dir + "/flags.kvtrace.h5", four_steps());
    Edit(p).set_u8s_attr("/run", "tier_attended", {1, 0});
    const std::string message = "has 2 flags (expected one per tier_names entry: 3)";
    CHECK_THROWS_WITH(TraceReader::open(p), p + ": /run attribute tier_attended: " + message);
    CHECK(has_violation(validate_trace(p), "/run attribute tier_attended", message));
  }
  SECTION("flags are 0 or 1") {
    const std::string p = Tiered().write(dir + "/flag7.kvtrace.h5", four_steps());
    Edit(p).set_u8s_attr("/run", "tier_attended", {1, 1, 7});
    CHECK(has_violation(validate_trace(p), "/run attribute tier_attended",
                        "flag 2 is 7 (expected 0 or 1)"));
  }
}

TEST_CASE("the validator checks every stall row", "[trace][stalls]") {
  const std::string dir = test::temp_dir();
  const std::string p = Tiered().write(dir + "/bad_stall.kvtrace.h5", four_steps());
  SECTION("a step beyond the trace") {
    Edit(p).write_i64("/stalls/step", 2, 99);
    CHECK(has_violation(validate_trace(p), "/stalls/step",
                        "1 value(s) outside [0, 4); first at row 2 = 99"));
  }
  SECTION("a negative wait") {
    Edit(p).write_f64("/stalls/wait_s", 1, -0.25);
    CHECK(has_violation(validate_trace(p), "/stalls/wait_s",
                        "1 value(s) outside [0, 1e+12]; first at row 1 = -0.25"));
  }
  SECTION("an infinite wait") {
    Edit(p).write_f64("/stalls/wait_s", 0, std::numeric_limits<double>::infinity());
    CHECK(has_violation(validate_trace(p), "/stalls/wait_s",
                        "1 value(s) outside [0, 1e+12]; first at row 0 = inf"));
  }
  SECTION("rows out of step order") {
    Edit(p).write_i64("/stalls/step", 0, 3);
    CHECK(has_violation(validate_trace(p), "/stalls/step",
                        "1 row(s) out of step order; first at row 1 = step 1 after step 3 "
                        "(expected nondecreasing steps)"));
  }
  SECTION("a head, a token and a verdict that do not exist") {
    {
      Edit e(p);
      e.write_i64("/stalls/layer", 0, 2);
      e.write_i64("/stalls/kv_head", 1, -1);
      e.write_i64("/stalls/token", 2, 4);
      e.write_i64("/stalls/needed", 0, 2);
    }
    ValidationReport r = validate_trace(p);
    CHECK(has_violation(r, "/stalls/layer", "1 value(s) outside [0, 2); first at row 0 = 2"));
    CHECK(has_violation(r, "/stalls/kv_head", "1 value(s) outside [0, 2); first at row 1 = -1"));
    CHECK(has_violation(r, "/stalls/token", "1 value(s) outside [0, 4); first at row 2 = 4"));
    CHECK(has_violation(r, "/stalls/needed", "1 value(s) outside [-1, 2); first at row 0 = 2"));
  }
  SECTION("a column longer than the others") {
    Edit(p).extend("/stalls/token", 1);
    CHECK(
        has_violation(validate_trace(p), "/stalls/token", "axis 0 (X) has length 4 (expected 3)"));
  }
}

TEST_CASE("the writer refuses stalls that name nothing the trace holds", "[trace][stalls]") {
  const std::string dir = test::temp_dir();
  Tiered tiered;
  auto w = TraceWriter::create(dir + "/refuse.kvtrace.h5", tiered.run, tiered.layout);
  w->append_step(Tiered::step(0, {}));
  CHECK_THROWS_WITH(w->append_step(Tiered::step(1, {{0, 0, 0, 0, 0.1f, -1}})),
                    Catch::EndsWith("/stalls/step: stall for step 0 appended in step 1"));
  auto w2 = TraceWriter::create(dir + "/refuse2.kvtrace.h5", tiered.run, tiered.layout);
  CHECK_THROWS_WITH(w2->append_step(Tiered::step(0, {{0, 0, 2, 0, 0.1f, -1}})),
                    Catch::EndsWith("/stalls/layer: layer/kv_head (0, 2) outside 2 x 2"));
  auto w3 = TraceWriter::create(dir + "/refuse3.kvtrace.h5", tiered.run, tiered.layout);
  CHECK_THROWS_WITH(w3->append_step(Tiered::step(0, {{0, 0, 0, 1, 0.1f, -1}})),
                    Catch::EndsWith("/stalls/token: token 1 not yet fed (1 tokens)"));
  auto w4 = TraceWriter::create(dir + "/refuse4.kvtrace.h5", tiered.run, tiered.layout);
  CHECK_THROWS_WITH(w4->append_step(Tiered::step(0, {{0, 0, 0, 0, -0.5f, -1}})),
                    Catch::EndsWith("/stalls/wait_s: is -0.5 s (expected finite and >= 0)"));
  auto w5 = TraceWriter::create(dir + "/refuse5.kvtrace.h5", tiered.run, tiered.layout);
  CHECK_THROWS_WITH(w5->append_step(Tiered::step(0, {{0, 0, 0, 0, std::nanf(""), -1}})),
                    Catch::EndsWith("/stalls/wait_s: is nan s (expected finite and >= 0)"));
  auto w6 = TraceWriter::create(dir + "/refuse6.kvtrace.h5", tiered.run, tiered.layout);
  CHECK_THROWS_WITH(w6->append_step(Tiered::step(0, {{0, 0, 0, 0, 0.1f, 2}})),
                    Catch::EndsWith("/stalls/needed: is 2 (expected -1, 0 or 1)"));

  Tiered short_flags({1, 0});
  CHECK_THROWS_WITH(
      TraceWriter::create(dir + "/flags.kvtrace.h5", short_flags.run, short_flags.layout),
      Catch::EndsWith("/run tier_attended: has 2 flags, expected one per tier name "
                      "(3) or none"));
  Tiered two({1, 2, 0});
  CHECK_THROWS_WITH(TraceWriter::create(dir + "/flag2.kvtrace.h5", two.run, two.layout),
                    Catch::EndsWith("/run tier_attended: flags must be 0 or 1"));
}

TEST_CASE("an incomplete trace shows only the stalls of committed steps", "[trace][stalls]") {
  const std::string dir = test::temp_dir();
  Tiered tiered;
  tiered.options.swmr = false;  // a plain read-write open can edit it afterwards
  const std::string p = tiered.write(dir + "/incomplete.kvtrace.h5", four_steps(), false);
  // A flush that wrote the stall of step 4 and was killed before it committed step 4.
  {
    Edit e(p);
    for (const char* c : {"/stalls/step", "/stalls/layer", "/stalls/kv_head", "/stalls/token",
                          "/stalls/wait_s", "/stalls/needed"})
      e.extend(c, 1);
    e.write_i64("/stalls/step", 3, 4);
  }
  {
    auto r = TraceReader::open(p);
    CHECK_FALSE(r->complete());
    REQUIRE(r->n_steps() == 4);
    CHECK(r->n_stalls() == 3);
    CHECK(same(r->stalls(), all_of(four_steps())));
    CHECK(same(r->stalls_of_step(3), four_steps()[3]));
  }
  check_valid(p);
  // Marked complete, the same row names a step the trace does not hold.
  {
    Edit e(p);
    hid_t d = H5Dopen2(e.file, "/run/complete", H5P_DEFAULT);
    const uint8_t one = 1;
    REQUIRE(H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, &one) >= 0);
    H5Dclose(d);
  }
  CHECK(has_violation(validate_trace(p), "/stalls/step",
                      "1 value(s) outside [0, 4); first at row 3 = 4"));
}

TEST_CASE("synthetic traces with an unattended cold tier stall on its tokens", "[trace][stalls]") {
  SyntheticSpec spec = test::small_spec(2, 8);
  spec.cold_attended = false;
  const std::string path = test::temp_dir() + "/synthetic_stalls.kvtrace.h5";
  write_synthetic_trace(path, spec);
  SyntheticCapture cap(spec);
  std::vector<StallRow> want;
  for (int64_t s = 0; s < cap.n_steps(); ++s) {
    StepData sd = cap.step(s);
    for (const StallRow& st : sd.stalls) {
      // Each stall fetches a token the head holds in tier 1 and does not read.
      CHECK(st.token >= spec.sinks);
      for (const ReceivedRow& row : sd.received)
        if (row.layer == st.layer && row.kv_head == st.kv_head)
          CHECK(std::find(row.tokens.begin(), row.tokens.end(), st.token) == row.tokens.end());
    }
    want.insert(want.end(), sd.stalls.begin(), sd.stalls.end());
  }
  REQUIRE(want.size() >= 3);
  auto r = TraceReader::open(path);
  CHECK(r->tier_attended() == std::vector<uint8_t>{1, 0});
  CHECK(same(r->stalls(), want));
  check_valid(path);
  // Attended cold tier (the default): no stalls.
  spec.cold_attended = true;
  write_synthetic_trace(path, spec);
  auto r2 = TraceReader::open(path);
  CHECK(r2->tier_attended() == std::vector<uint8_t>{1, 1});
  CHECK(r2->stalls().empty());
}

TEST_CASE("kvscope info shows the stalls and which tiers are attended", "[trace][stalls][cli]") {
  const std::string dir = test::temp_dir();
  const std::string path = dir + "/info_stalls.kvtrace.h5";
  std::string out;
  REQUIRE(test::run_command(test::kvscope_exe() +
                                " synth --layers 2 --heads 4 --kv-heads 2 "
                                "--prompt-tokens 24 --decode-steps 40 "
                                "--tiers 2 --window 4 --cold-unattended -o " +
                                path,
                            &out) == 0);
  auto r = TraceReader::open(path);
  const std::vector<StallRow> stalls = r->stalls();
  REQUIRE(!stalls.empty());
  double wait = 0;
  for (const StallRow& st : stalls) wait += st.wait_s;

  REQUIRE(test::run_command(test::kvscope_exe() + " info " + path, &out) == 0);
  CHECK_THAT(out, Catch::Contains("tiers: hot cold (not attended)\n"));
  CHECK_THAT(out, Catch::Contains("stalls    " + std::to_string(stalls.size()) + ", total wait "));
  REQUIRE(test::run_command(test::kvscope_exe() + " info --json " + path + " 2>/dev/null", &out) ==
          0);
  nlohmann::json j = nlohmann::json::parse(out);
  CHECK(j["tier_attended"] == nlohmann::json::array({1, 0}));
  CHECK(j["stalls"]["count"] == stalls.size());
  CHECK(std::abs(j["stalls"]["wait_s"].get<double>() - wait) < 1e-9);
  CHECK(j["stalls"]["needed"].get<int64_t>() + j["stalls"]["not_needed"].get<int64_t>() ==
        int64_t(stalls.size()));

  CHECK(test::run_command(
            test::kvscope_exe() + " synth --cold-unattended -o " + dir + "/one_tier.kvtrace.h5",
            &out) == 2);
  CHECK_THAT(out, Catch::Contains("--cold-unattended: needs a cold tier to leave unread "
                                  "(expected --tiers 2)"));
}
