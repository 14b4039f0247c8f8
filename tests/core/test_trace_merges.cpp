// /merges and /rerotations (format minor version 4): entries a merging policy
// folded into a surviving entry as they left, and kept keys a policy moved to
// another RoPE position. Round trip through writer and reader, older minor
// versions (neither table), the writer's and the validator's refusals.
#include <catch2/catch.hpp>

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

constexpr int64_t kL = 2, kK = 2;

// One tier, one token per step, no events.
struct Merging {
  RunInfo run;
  CaptureLayout layout;

  Merging() {
    run = test::tiny_run(kL, kK);
    layout.max_tokens = 16;
  }

  static StepData step(int32_t s, std::vector<MergeRow> merges,
                       std::vector<RerotationRow> rerotations = {}) {
    StepData sd;
    sd.step.first_token = s;
    sd.step.n_tokens = 1;
    sd.tokens.push_back({s % 100, s, TokenRole::Prompt, s, -1, "t"});
    sd.occupancy.assign(size_t(kL * kK), 0);
    sd.merges = std::move(merges);
    sd.rerotations = std::move(rerotations);
    return sd;
  }

  std::string write(const std::string& path,
                    const std::vector<std::vector<MergeRow>>& steps) const {
    auto w = TraceWriter::create(path, run, layout, {});
    for (size_t s = 0; s < steps.size(); ++s) w->append_step(step(int32_t(s), steps[s]));
    w->close({});
    return path;
  }

  std::string write_rerotations(const std::string& path,
                                const std::vector<std::vector<RerotationRow>>& steps) const {
    auto w = TraceWriter::create(path, run, layout, {});
    for (size_t s = 0; s < steps.size(); ++s) w->append_step(step(int32_t(s), {}, steps[s]));
    w->close({});
    return path;
  }
};

// Step 2 moves token 2 to position 0 (head 0, 0) and token 1 to 0 (head 1, 1);
// step 3 moves token 3 to position 1 (head 0, 1).
std::vector<std::vector<RerotationRow>> four_rerotation_steps() {
  return {{}, {}, {{2, 0, 0, 2, 0}, {2, 1, 1, 1, 0}}, {{3, 0, 1, 3, 1}}};
}

bool same(const std::vector<RerotationRow>& a, const std::vector<RerotationRow>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].step != b[i].step || a[i].layer != b[i].layer || a[i].kv_head != b[i].kv_head ||
        a[i].token != b[i].token || a[i].position != b[i].position)
      return false;
  return true;
}

// Step 2 folds token 0 into 1 (head 0, 0) and token 2 into 1 (head 1, 1); step 3 folds 3 into 0.
std::vector<std::vector<MergeRow>> four_steps() {
  return {{}, {}, {{2, 0, 0, 0, 1, 0.25f}, {2, 1, 1, 2, 1, 0.5f}}, {{3, 0, 1, 3, 0, 0.75f}}};
}

bool same(const std::vector<MergeRow>& a, const std::vector<MergeRow>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].step != b[i].step || a[i].layer != b[i].layer || a[i].kv_head != b[i].kv_head ||
        a[i].token != b[i].token || a[i].into != b[i].into || a[i].weight != b[i].weight)
      return false;
  return true;
}

void check_valid(const std::string& path) {
  ValidationReport report = validate_trace(path);
  for (const Violation& v : report.violations) UNSCOPED_INFO(v.field << ": " << v.message);
  CHECK(report.ok());
}

}  // namespace

TEST_CASE("merges round-trip", "[trace][merges]") {
  const std::string path = Merging().write(test::temp_dir() + "/merges.kvtrace.h5", four_steps());
  auto r = TraceReader::open(path);
  CHECK(r->format_minor_version() == kFormatMinorVersion);
  CHECK(r->n_merges() == 3);
  std::vector<MergeRow> all = four_steps()[2];
  all.push_back(four_steps()[3][0]);
  CHECK(same(r->merges(), all));
  CHECK(r->merges_of_step(1).empty());
  CHECK(same(r->merges_of_step(2), four_steps()[2]));
  CHECK(same(r->merges_of_step(3), four_steps()[3]));
  CHECK_THROWS_WITH(r->merges_of_step(4), Catch::Contains("/merges/step: step 4 outside [0, 4)"));
  check_valid(path);
}

TEST_CASE("traces of minor versions 0 to 3 read with no merges", "[trace][merges]") {
  for (int64_t minor : {3, 2, 0}) {
    INFO("minor version " << minor);
    const std::string path = Merging().write(
        test::temp_dir() + "/old-merges" + std::to_string(minor) + ".kvtrace.h5", four_steps());
    {
      Edit e(path);
      e.remove("/merges");
      e.remove("/rerotations");
      if (minor < 3) e.remove("/stalls");
      if (minor < 3) e.remove_attr("/run", "tier_attended");
      e.set_i64_attr("/", "minor_version", minor);
    }
    auto r = TraceReader::open(path);
    CHECK(r->n_merges() == 0);
    CHECK(r->merges().empty());
    CHECK(r->n_rerotations() == 0);
    CHECK(r->rerotations().empty());
    check_valid(path);
  }
}

TEST_CASE("the validator checks every merge row", "[trace][merges]") {
  const std::string dir = test::temp_dir();
  SECTION("a step beyond the trace") {
    const std::string p = Merging().write(dir + "/m-step.kvtrace.h5", four_steps());
    Edit(p).write_i64("/merges/step", 0, 99);
    CHECK(has_violation(validate_trace(p), "/merges/step",
                        "1 value(s) outside [0, 4); first at row 0 = 99"));
  }
  SECTION("an absorbing token that was never fed") {
    const std::string p = Merging().write(dir + "/m-into.kvtrace.h5", four_steps());
    Edit(p).write_i64("/merges/into", 1, 40);
    CHECK(has_violation(validate_trace(p), "/merges/into",
                        "1 value(s) outside [0, 4); first at row 1 = 40"));
  }
  SECTION("a negative weight") {
    const std::string p = Merging().write(dir + "/m-weight.kvtrace.h5", four_steps());
    Edit(p).write_f64("/merges/weight", 0, -1);
    CHECK(has_violation(validate_trace(p), "/merges/weight",
                        "1 value(s) outside [0, 1e+30]; first at row 0 = -1"));
  }
  SECTION("rows out of step order") {
    const std::string p = Merging().write(dir + "/m-order.kvtrace.h5", four_steps());
    Edit(p).write_i64("/merges/step", 1, 0);
    CHECK(has_violation(validate_trace(p), "/merges/step",
                        "1 row(s) out of step order; first at row 1 = step 0 after step 2 "
                        "(expected nondecreasing steps)"));
  }
  SECTION("a column deleted") {
    const std::string p = Merging().write(dir + "/m-gone.kvtrace.h5", four_steps());
    Edit(p).remove("/merges/into");
    CHECK(has_violation(validate_trace(p), "/merges/into", "dataset missing"));
  }
}

TEST_CASE("the writer refuses merges that name nothing the trace holds", "[trace][merges]") {
  const std::string dir = test::temp_dir();
  auto refused = [&](MergeRow m, const std::string& field) {
    Merging w;
    std::vector<std::vector<MergeRow>> steps = {{}, {}, {m}};
    CHECK_THROWS_WITH(w.write(dir + "/refused.kvtrace.h5", steps), Catch::Contains(field));
  };
  refused({2, 0, 0, 0, 0, 0.5f}, "/merges/into");   // into itself
  refused({2, 0, 0, 0, 7, 0.5f}, "/merges/into");   // into a token not yet fed
  refused({2, 0, 0, 5, 1, 0.5f}, "/merges/token");  // a token not yet fed
  refused({2, 0, 0, 0, 1, -1.0f}, "/merges/weight");
  refused({2, 0, 0, 0, 1, std::numeric_limits<float>::quiet_NaN()}, "/merges/weight");
  refused({1, 0, 0, 0, 1, 0.5f}, "/merges/step");  // another step's row
  refused({2, 5, 0, 0, 1, 0.5f}, "/merges/layer");
}

TEST_CASE("rerotations round-trip", "[trace][rerotations]") {
  const std::string path = Merging().write_rerotations(test::temp_dir() + "/rerotations.kvtrace.h5",
                                                       four_rerotation_steps());
  auto r = TraceReader::open(path);
  CHECK(r->n_rerotations() == 3);
  std::vector<RerotationRow> all = four_rerotation_steps()[2];
  all.push_back(four_rerotation_steps()[3][0]);
  CHECK(same(r->rerotations(), all));
  CHECK(r->n_merges() == 0);
  check_valid(path);
}

TEST_CASE("the validator checks every re-rotation row", "[trace][rerotations]") {
  const std::string dir = test::temp_dir();
  auto written = [&](const std::string& name) {
    return Merging().write_rerotations(dir + "/" + name + ".kvtrace.h5", four_rerotation_steps());
  };
  SECTION("a position beyond the trace's tokens") {
    const std::string p = written("z-position");
    Edit(p).write_i64("/rerotations/position", 2, 40);
    CHECK(has_violation(validate_trace(p), "/rerotations/position",
                        "1 value(s) outside [0, 4); first at row 2 = 40"));
  }
  SECTION("a head that does not exist") {
    const std::string p = written("z-head");
    Edit(p).write_i64("/rerotations/kv_head", 0, 5);
    CHECK(has_violation(validate_trace(p), "/rerotations/kv_head",
                        "1 value(s) outside [0, 2); first at row 0 = 5"));
  }
  SECTION("rows out of step order") {
    const std::string p = written("z-order");
    Edit(p).write_i64("/rerotations/step", 1, 0);
    CHECK(has_violation(validate_trace(p), "/rerotations/step",
                        "1 row(s) out of step order; first at row 1 = step 0 after step 2 "
                        "(expected nondecreasing steps)"));
  }
  SECTION("a column deleted") {
    const std::string p = written("z-gone");
    Edit(p).remove("/rerotations/position");
    CHECK(has_violation(validate_trace(p), "/rerotations/position", "dataset missing"));
  }
}

TEST_CASE("the writer refuses re-rotations that name nothing the trace holds",
          "[trace][rerotations]") {
  const std::string dir = test::temp_dir();
  auto refused = [&](RerotationRow z, const std::string& field) {
    std::vector<std::vector<RerotationRow>> steps = {{}, {}, {z}};
    CHECK_THROWS_WITH(Merging().write_rerotations(dir + "/refused-z.kvtrace.h5", steps),
                      Catch::Contains(field));
  };
  refused({2, 0, 0, 1, 2}, "/rerotations/position");  // forwards, past its own position
  refused({2, 0, 0, 1, -1}, "/rerotations/position");
  refused({2, 0, 0, 7, 0}, "/rerotations/token");  // a token not yet fed
  refused({1, 0, 0, 0, 0}, "/rerotations/step");   // another step's row
  refused({2, 5, 0, 1, 0}, "/rerotations/layer");
}

namespace {

// Step 1 prunes channels 0 and 3 of head (0, 1) and channel 2 of head (1, 0).
std::vector<KeyChannelRow> pruned_at_step1() {
  return {{1, 0, 1, 0}, {1, 0, 1, 3}, {1, 1, 0, 2}};
}

std::string write_key_channels(const std::string& path, const std::vector<KeyChannelRow>& rows) {
  Merging m;
  auto w = TraceWriter::create(path, m.run, m.layout, {});
  for (int32_t s = 0; s < 3; ++s) {
    StepData sd = Merging::step(s, {});
    if (s == 1) sd.key_channels = rows;
    w->append_step(sd);
  }
  w->close({});
  return path;
}

}  // namespace

TEST_CASE("pruned key channels round-trip, and minor version 6 traces read with none",
          "[trace][key_channels]") {
  const std::string path =
      write_key_channels(test::temp_dir() + "/channels.kvtrace.h5", pruned_at_step1());
  {
    auto r = TraceReader::open(path);
    REQUIRE(r->n_pruned_key_channels() == 3);
    const std::vector<KeyChannelRow> got = r->pruned_key_channels();
    for (size_t i = 0; i < got.size(); ++i) {
      const KeyChannelRow want = pruned_at_step1()[i];
      CHECK((got[i].step == want.step && got[i].layer == want.layer &&
             got[i].kv_head == want.kv_head && got[i].channel == want.channel));
    }
  }
  check_valid(path);
  {
    Edit e(path);
    e.remove("/key_channels");
    e.set_i64_attr("/", "minor_version", 6);
  }
  auto old = TraceReader::open(path);
  CHECK(old->n_pruned_key_channels() == 0);
  CHECK(old->pruned_key_channels().empty());
  check_valid(path);
}

TEST_CASE("the validator and the writer check every pruned key channel row",
          "[trace][key_channels]") {
  const std::string dir = test::temp_dir();
  const int64_t hd = Merging().run.model.head_dim;
  SECTION("a channel beyond head_dim") {
    const std::string p = write_key_channels(dir + "/p-channel.kvtrace.h5", pruned_at_step1());
    Edit(p).write_i64("/key_channels/channel", 1, hd);
    CHECK(has_violation(validate_trace(p), "/key_channels/channel",
                        "1 value(s) outside [0, " + std::to_string(hd) +
                            "); first at row 1 = " + std::to_string(hd)));
  }
  SECTION("a column deleted") {
    const std::string p = write_key_channels(dir + "/p-gone.kvtrace.h5", pruned_at_step1());
    Edit(p).remove("/key_channels/kv_head");
    CHECK(has_violation(validate_trace(p), "/key_channels/kv_head", "dataset missing"));
  }
  SECTION("the writer refuses a channel the model does not have") {
    CHECK_THROWS_WITH(
        write_key_channels(dir + "/p-refused.kvtrace.h5", {{1, 0, 0, static_cast<int16_t>(hd)}}),
        Catch::Contains("/key_channels/channel"));
    CHECK_THROWS_WITH(write_key_channels(dir + "/p-refused2.kvtrace.h5", {{1, 0, 5, 0}}),
                      Catch::Contains("/key_channels/layer"));
  }
}
