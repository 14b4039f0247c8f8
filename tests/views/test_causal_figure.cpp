// The causal map (views/causal_figure.h) from a causal.json beside a trace:
// cells coloured by the share of the gap their restoration alone recovers,
// the minimal set marked, a click's replay trace, the CSV, a trace without a
// search told what to run, and a layout without clipped text.
#include <catch2/catch.hpp>

#include <QTextStream>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/causal_figure.h"
#include "views/layout_check.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

// A search on the small synthetic shape (4 layers x 4 kv heads): layer 1
// alone recovers half the gap, head 2.3 alone all of it.
void write_report(const std::string& trace) {
  std::filesystem::create_directories(trace + ".causal");
  nlohmann::json j = {
      {"n_layers", 4},
      {"kv_heads", 4},
      {"replays", 9},
      {"recoverable", true},
      {"original", {{"logprob", -10.0}}},
      {"full_restoration", {{"logprob", -2.0}}},
      {"minimal_set", {"2.3"}},
      {"words",
       "replays: 9 of a budget of 24\nrestoring the policy's losses in layer 2 kv head 3 "
       "recovers the answer"},
      {"threshold_logprob", -2.8},
      {"replay_list",
       {{{"effect", {{"logprob", -2.0}}}, {"recovered", true}},
        {{"effect", {{"logprob", -9.0}}}, {"recovered", false}},
        {{"effect", {{"logprob", -2.5}}}, {"recovered", true}}}},
      {"heads",
       {{{"layer", 2},
         {"kv_head", 3},
         {"restore_alone", {{"logprob", -2.0}}},
         {"restore_trace", "replay-004.kvtrace.h5"}}}},
      {"layers",
       {{{"layer", 1},
         {"restore_alone", {{"logprob", -6.0}}},
         {"restore_trace", "replay-006.kvtrace.h5"}},
        {{"layer", 2},
         {"restore_alone", {{"logprob", -2.5}}},
         {"restore_trace", "replay-007.kvtrace.h5"}}}}};
  std::ofstream(trace + ".causal/causal.json") << j.dump(1);
}

}  // namespace

TEST_CASE("causal map: restoration effects per head, the minimal set, the replay to open") {
  test::qt_app(true);
  const std::string path = test::write_trace(test::small_spec(), "causal.kvtrace.h5");
  TraceData bare(trace::TraceReader::open(path));
  CHECK_THAT(CausalFigure::load(bare)->missing_data().toStdString(),
             Catch::Contains("kvscope why TRACE --causal"));
  write_report(path);
  TraceData data(trace::TraceReader::open(path));
  const auto f = CausalFigure::load(data);
  REQUIRE(f->missing_data().isEmpty());
  using M = CausalFigure::Measured;
  const auto& cells = f->cells;
  CHECK(cells[2 * 4 + 3].measured == M::Head);
  CHECK(cells[2 * 4 + 3].minimal);
  CHECK(cells[2 * 4 + 0].measured == M::Layer);
  CHECK(cells[2 * 4 + 0].logprob == Approx(-2.5));
  CHECK(cells[1 * 4 + 2].measured == M::Layer);
  CHECK(cells[0].measured == M::None);
  CHECK(f->trace_of(2, 3) == f->folder.toStdString() + "/replay-004.kvtrace.h5");
  CHECK(f->trace_of(1, 0) == f->folder.toStdString() + "/replay-006.kvtrace.h5");
  CHECK(f->trace_of(0, 0).empty());
  QString csv;
  QTextStream out(&csv);
  f->write_csv(out);
  out.flush();
  CHECK(csv.contains("1,2,layer,-6,0.5,0,replay-006.kvtrace.h5\n"));
  CHECK(csv.contains("2,3,head,-2,1,1,replay-004.kvtrace.h5\n"));
  CHECK(csv.contains("0,0,none,,,0,\n"));
  // Every cell maps back from a point inside it.
  const QRectF area(0, 0, 900, 640);
  int64_t hits = 0;
  for (double y = 0; y < 640; y += 3)
    for (double x = 0; x < 900; x += 3) {
      int64_t l = -1, k = -1;
      if (f->cell_at(area, {x, y}, &l, &k) && l == 2 && k == 3) ++hits;
    }
  CHECK(hits > 10);
  CHECK(f->describe(2, 3).contains("in the minimal set"));
  REQUIRE(f->replay_list.size() == 3);
  CHECK(f->replay_list[1].logprob == Approx(-9.0));
  CHECK(f->words.startsWith("restoring the policy's losses"));
  for (const ExportOptions& page : {ExportOptions{520, 380, 96}, ExportOptions{1200, 800, 96},
                                    export_preset("column"), export_preset("slide")}) {
    const LayoutReport report = check_layout(*f, page);
    std::string problems;
    for (const QString& p : report.problems) problems += p.toStdString() + "\n";
    INFO(page.width << "x" << page.height << ": " << problems);
    CHECK(report.ok());
  }
}

TEST_CASE("causal map: a report for another model shape is refused naming the file") {
  test::qt_app(true);
  const std::string path = test::write_trace(test::small_spec(), "other.kvtrace.h5");
  std::filesystem::create_directories(path + ".causal");
  std::ofstream(path + ".causal/causal.json") << R"({"n_layers": 30, "kv_heads": 3})";
  TraceData data(trace::TraceReader::open(path));
  CHECK_THROWS_WITH(CausalFigure::load(data), Catch::Contains("another model shape"));
  // A head outside the shape, or no JSON at all: refused naming the file, nothing indexed.
  for (const char* text : {R"({"n_layers": 4, "kv_heads": 4, "original": {}, "full_restoration": {},
                                "heads": [{"layer": 9, "kv_head": 0, "restore_alone": {"logprob": 1}}]})",
                           R"({"n_layers": 4, "kv_heads": 4, "original": {}, "full_restoration": {},
                                "minimal_set": ["x.y"]})",
                           "[1, 2]", "{"}) {
    std::ofstream(path + ".causal/causal.json") << text;
    TraceData again(trace::TraceReader::open(path));
    CHECK_THROWS_WITH(CausalFigure::load(again),
                      Catch::Contains("causal.json: is not the search's JSON"));
  }
}
