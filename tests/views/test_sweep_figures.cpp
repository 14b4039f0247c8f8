// The figures of a sweep's results table (views/sweep_results_figure.h): the
// memory curve's points, intervals and click targets on rows with known
// values, both kinds laid out without clipped or overlapping text at window
// and paper sizes, and the metrics each kind refuses.
#include <QTextStream>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "core/common/input_error.h"
#include "tests/views/qt_app.h"
#include "views/causal_heads_figure.h"
#include "views/layout_check.h"
#include "views/pareto_figure.h"
#include "views/sweep_figure.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

sweep::ResultRow cell(const std::string& id, const std::string& policy,
                      std::optional<double> budget, const std::string& task, int64_t success,
                      double kv_bytes, double depth = 0.5) {
  sweep::ResultRow r;
  r.cell_id = id;
  r.model = "m.gguf";
  r.policy = policy;
  r.budget = budget;
  r.task_base = task;
  r.task = task + ":tokens=800,depth=" + std::to_string(depth);
  r.tokens = 800;
  r.depth = depth;
  r.seed = 1;
  r.status = "ok";
  r.success = success;
  r.score = double(success);
  r.kv_bytes_mean = kv_bytes;
  r.kv_bytes_peak = int64_t(kv_bytes * 1.25);
  r.needle_heads_whole = success ? 90 : 30;
  r.n_heads = 90;
  r.n_kv_heads = 3;
  r.max_kl = success ? 0.1 : 0.9;
  r.trace = "traces/" + id + ".kvtrace.h5";
  return r;
}

// Two tasks; full once; SnapKV at 0.25 (3 of 4 found) and 0.5 (4 of 4); TOVA
// at 0.25 with one failed cell; on the second task one point only.
std::vector<sweep::ResultRow> table() {
  const double MiB = 1024.0 * 1024;
  std::vector<sweep::ResultRow> rows;
  for (int i = 0; i < 4; ++i)
    rows.push_back(
        cell("f" + std::to_string(i), "full", std::nullopt, "needle", 1, 8 * MiB, 0.2 * (i + 1)));
  rows.push_back(cell("s0", "snapkv:window=8,budget=0.25", 0.25, "needle", 1, 2 * MiB, 0.2));
  rows.push_back(cell("s1", "snapkv:window=8,budget=0.25", 0.25, "needle", 0, 2.5 * MiB, 0.4));
  rows.back().causal_set = "2.1 29.0";  // the causal search's minimal set of the miss
  rows.back().causal_set_size = 2;
  rows.back().causal_replays = 14;
  rows.back().causal_minimal = 1;
  rows.push_back(cell("s2", "snapkv:window=8,budget=0.25", 0.25, "needle", 1, 2 * MiB, 0.6));
  rows.push_back(cell("s3", "snapkv:window=8,budget=0.25", 0.25, "needle", 1, 1.5 * MiB, 0.8));
  for (int i = 0; i < 4; ++i)
    rows.push_back(cell("h" + std::to_string(i), "snapkv:window=8,budget=0.5", 0.5, "needle", 1,
                        4 * MiB, 0.2 * (i + 1)));
  rows.push_back(cell("t0", "tova:budget=0.25", 0.25, "needle", 1, 2 * MiB, 0.2));
  sweep::ResultRow failed = cell("t1", "tova:budget=0.25", 0.25, "needle", 0, 2 * MiB, 0.4);
  failed.status = "failed";
  failed.success.reset();
  failed.error = "out of memory";
  rows.push_back(failed);
  rows.push_back(cell("d0", "tova:budget=0.25", 0.25, "dataset", 0, 0.5 * MiB));
  rows.back().causal_set = "2.1";
  rows.back().causal_set_size = 1;
  rows.push_back(cell("d1", "tova:budget=0.25", 0.25, "dataset", 0, 0.5 * MiB, 0.7));
  rows.back().causal_set_size = -1;  // restoring every loss did not recover it
  return rows;
}

const ParetoFigure::Point& point_of(const ParetoFigure& f, const std::string& line,
                                    const std::string& task, std::optional<double> budget) {
  for (const ParetoFigure::Point& pt : f.points())
    if (f.lines()[pt.line] == line && f.tasks()[pt.task] == task && pt.budget == budget) return pt;
  FAIL("no point " << line << " on " << task);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("memory curve: one point per policy, budget and task, with its 95 % interval") {
  test::qt_app(true);
  const ParetoFigure f("s", table(), SweepMetric::Success);
  CHECK(f.lines() == std::vector<std::string>{"full", "snapkv:window=8", "tova"});
  CHECK(f.tasks() == std::vector<std::string>{"needle", "dataset"});
  CHECK(f.points().size() == 5);
  const double MiB = 1024.0 * 1024;
  const ParetoFigure::Point& s25 = point_of(f, "snapkv:window=8", "needle", 0.25);
  CHECK(s25.rows.size() == 4);
  CHECK(s25.ran == 4);
  CHECK(s25.value == Approx(0.75));
  CHECK(s25.kv_bytes == Approx(2 * MiB));
  CHECK(s25.kv_peak == Approx(2.5 * MiB * 1.25));
  // Wilson's interval for 3 of 4 at 95 %.
  CHECK(s25.lo == Approx(0.30064).epsilon(1e-4));
  CHECK(s25.hi == Approx(0.95441).epsilon(1e-4));
  // 4 of 4: the interval reaches 1 and stays below it from 0.51.
  const ParetoFigure::Point& s50 = point_of(f, "snapkv:window=8", "needle", 0.5);
  CHECK(s50.value == 1.0);
  CHECK(s50.hi == Approx(1.0));
  CHECK(s50.lo == Approx(0.51010).epsilon(1e-4));
  // The failed cell belongs to the point but not to its value.
  const ParetoFigure::Point& t = point_of(f, "tova", "needle", 0.25);
  CHECK(t.rows.size() == 2);
  CHECK(t.ran == 1);
  CHECK(f.rows()[t.rows.back()].cell_id == "t1");
  CHECK(point_of(f, "full", "needle", std::nullopt).kv_bytes == Approx(8 * MiB));

  // A score that is 0 or 1 in every cell is a share too: Wilson's interval,
  // so four misses do not read as certain.
  const ParetoFigure score("s", table(), SweepMetric::Score);
  CHECK(point_of(score, "snapkv:window=8", "needle", 0.25).lo == Approx(s25.lo));
  std::vector<sweep::ResultRow> misses;
  for (int i = 0; i < 4; ++i)
    misses.push_back(cell("m" + std::to_string(i), "knorm:budget=0.1", 0.1, "needle", 0, 1e6));
  const ParetoFigure none("s", misses, SweepMetric::Score);
  CHECK(none.points().front().value == 0);
  CHECK(none.points().front().hi == Approx(0.48990).epsilon(1e-4));

  // Other metrics: mean +- 1.96 standard errors, bounded to [0, 1] where the
  // metric is a share; KL unbounded above.
  const ParetoFigure surv("s", table(), SweepMetric::NeedleSurvival);
  const ParetoFigure::Point& v = point_of(surv, "snapkv:window=8", "needle", 0.25);
  const double mean = (1 + 1 + 1 + 1.0 / 3) / 4;
  const double sd = std::sqrt((3 * std::pow(1 - mean, 2) + std::pow(1.0 / 3 - mean, 2)) / 3);
  CHECK(v.value == Approx(mean));
  CHECK(v.lo == Approx(mean - 1.959964 * sd / 2));
  CHECK(v.hi == 1.0);
  const ParetoFigure kl("s", table(), SweepMetric::Kl);
  const ParetoFigure::Point& k = point_of(kl, "snapkv:window=8", "needle", 0.25);
  CHECK(k.value == Approx(0.3));
  CHECK(k.hi == Approx(0.3 + 1.959964 * 0.4 / 2));
  CHECK(k.lo == Approx(0.0));  // 0.3 - 0.392, bounded at 0
}

TEST_CASE("memory curve: a click on a point opens a missed cell first, tooltips and CSV") {
  test::qt_app(true);
  const ParetoFigure f("s", table(), SweepMetric::Success);
  const QRectF area(0, 0, 900, 560);
  const QRectF mark = f.cell_area(area, "s2");
  REQUIRE(!mark.isEmpty());
  CHECK(f.cell_area(area, "s0") == mark);  // one point holds the budget's cells
  const std::vector<const sweep::ResultRow*> hit = f.cell_at(area, mark.center());
  REQUIRE(hit.size() == 4);
  CHECK(hit.front()->cell_id == "s1");  // the missed one
  CHECK(f.cell_at(area, mark.center() + QPointF(40, 40)).empty());
  const QString tip = f.tooltip(area, mark.center());
  CHECK(tip.contains("snapkv:window=8, budget 0.25 of the prompt"));
  CHECK(tip.contains("over 4 of 4 cells"));
  CHECK(tip.contains("KV held 2 MiB"));
  CHECK(f.tooltip(area, QPointF(1, 1)).isEmpty());
  QString csv;
  QTextStream out(&csv);
  f.write_csv(out);
  out.flush();
  CHECK(csv.startsWith("task,policy,budget,cells,ran,kv_bytes_mean,kv_bytes_peak,success,lo,hi\n"));
  CHECK(csv.contains("needle,snapkv:window=8,0.25,4,4,2097152,3276800,0.75,"));
  CHECK(csv.contains("needle,full,,4,4,8388608,"));
  CHECK(csv.count('\n') == 6);
}

TEST_CASE("memory curve: a dataset's rows are one task, several models a line each") {
  test::qt_app(true);
  std::vector<sweep::ResultRow> rows;
  for (int i = 0; i < 3; ++i)
    for (const char* model : {"/m/a.gguf", "/m/b.gguf"}) {
      sweep::ResultRow r =
          cell(std::string(model) + std::to_string(i), "full", std::nullopt,
               "dataset:file=/data/d.jsonl,scorer=f1,row=" + std::to_string(i), i == 0, 1000);
      r.model = model;
      rows.push_back(r);
    }
  const ParetoFigure f("s", rows, SweepMetric::Success);
  CHECK(f.tasks() == std::vector<std::string>{"dataset:file=/data/d.jsonl,scorer=f1"});
  CHECK(f.lines() == std::vector<std::string>{"a.gguf · full", "b.gguf · full"});
  REQUIRE(f.points().size() == 2);
  CHECK(f.points()[0].ran == 3);
  CHECK(f.points()[0].value == Approx(1.0 / 3));
}

TEST_CASE("sweep grid: a dataset's rows are one task's cell, averaged like seeds") {
  test::qt_app(true);
  std::vector<sweep::ResultRow> rows;
  for (int i = 0; i < 3; ++i)
    rows.push_back(cell("r" + std::to_string(i), "full", std::nullopt,
                        "dataset:file=/data/d.jsonl,scorer=f1,row=" + std::to_string(i), i == 0,
                        1000));
  const SweepFigure grid("s", rows, SweepMetric::Success);
  const QRectF area(0, 0, 900, 560);
  const QRectF mark = grid.cell_area(area, "r2");
  REQUIRE(!mark.isEmpty());
  CHECK(grid.cell_area(area, "r0") == mark);
  CHECK(grid.cell_at(area, mark.center()).size() == 3);
  QString csv;
  QTextStream out(&csv);
  grid.write_csv(out);
  out.flush();
  CHECK(csv.contains("full,\"dataset:file=/data/d.jsonl,scorer=f1\",800,0.5,3,3,0.333333"));
  CHECK(sweep_task_label("dataset:file=/data/d.jsonl,scorer=f1") ==
        "dataset:file=d.jsonl,scorer=f1");
  CHECK(sweep_task_label("niah:keys=2") == "niah:keys=2");
}

TEST_CASE("memory curve: a table without KV bytes or without the metric says what it lacks") {
  test::qt_app(true);
  std::vector<sweep::ResultRow> rows = table();
  for (sweep::ResultRow& r : rows) r.kv_bytes_mean.reset();
  CHECK(ParetoFigure("s", rows, SweepMetric::Score).missing_data().contains("kv_bytes_mean"));
  rows = table();
  for (sweep::ResultRow& r : rows) r.max_kl.reset();
  CHECK(ParetoFigure("s", rows, SweepMetric::Kl).missing_data().contains("max_kl"));
  CHECK(ParetoFigure("s", table(), SweepMetric::Kl).missing_data().isEmpty());
}

TEST_CASE("sweep figures by kind: metrics each kind shows, and the refused ones") {
  test::qt_app(true);
  CHECK(find_sweep_figure_kind("sweep"));
  CHECK(find_sweep_figure_kind("pareto"));
  CHECK_FALSE(find_sweep_figure_kind("heatmap"));
  CHECK(make_sweep_figure("pareto", "s", table(), "")->metric() == SweepMetric::Score);
  CHECK(make_sweep_figure("sweep", "s", table(), "")->metric() == SweepMetric::Success);
  CHECK(dynamic_cast<ParetoFigure*>(make_sweep_figure("pareto", "s", table(), "kl").get()));
  CHECK_THROWS_AS(make_sweep_figure("sweep", "s", table(), "kl"), InputError);
  CHECK_THROWS_WITH(make_sweep_figure("pareto", "s", table(), "recall"),
                    Catch::Contains("unknown sweep metric 'recall'"));
  for (SweepMetric m : {SweepMetric::Success, SweepMetric::Score, SweepMetric::NeedleSurvival,
                        SweepMetric::Kl, SweepMetric::CausalSet})
    CHECK(sweep_metric_from_name(sweep_metric_name(m)) == m);
  CHECK(dynamic_cast<CausalHeadsFigure*>(make_sweep_figure("heads", "s", table(), "").get()));
  CHECK_THROWS_AS(make_sweep_figure("heads", "s", table(), "score"), InputError);
}

TEST_CASE("retrieval heads: how often each head is in a policy's minimal sets, click to a cell") {
  test::qt_app(true);
  const CausalHeadsFigure f("s", table(), SweepMetric::CausalSet);
  REQUIRE(f.layers() == 30);
  REQUIRE(f.kv_heads() == 3);
  REQUIRE(f.panels().size() == 2);
  const auto& snap = f.panels()[0];
  CHECK(snap.policy == "snapkv:window=8");
  CHECK(snap.searched.size() == 1);
  CHECK(snap.minimal == 1);
  CHECK(snap.count[2 * 3 + 1] == 1);
  CHECK(snap.count[29 * 3 + 0] == 1);
  CHECK(std::accumulate(snap.count.begin(), snap.count.end(), 0) == 2);
  const auto& tova = f.panels()[1];
  CHECK(tova.searched.size() == 1);
  CHECK(tova.unrecoverable == 1);
  CHECK(tova.minimal == 0);
  CHECK(tova.count[2 * 3 + 1] == 1);
  QString csv;
  QTextStream out(&csv);
  f.write_csv(out);
  out.flush();
  CHECK(csv.count('\n') == 1 + 2 * 90);
  CHECK(csv.contains("\"snapkv:window=8\",2,1,1,1,1\n"));
  // A click on layer 2 kv head 1 of the first panel reaches the miss whose set holds it.
  const QRectF area(0, 0, 900, 700);
  bool found = false;
  for (double y = 40; y < 700 && !found; y += 2)
    for (double x = 0; x < 450 && !found; x += 2) {
      const auto cells = f.cell_at(area, {x, y});
      if (!cells.empty() && cells.front()->cell_id == "s1" &&
          f.tooltip(area, {x, y}).contains("layer 2 kv head 1: in 1 of 1"))
        found = true;
    }
  CHECK(found);
  CHECK(f.missing_data().isEmpty());
  CHECK_FALSE(CausalHeadsFigure("s", {}, SweepMetric::CausalSet).missing_data().isEmpty());
}

TEST_CASE("sweep figures lay out without clipped or overlapping text at every page size") {
  test::qt_app(true);
  const std::vector<ExportOptions> pages = {{520, 380, 96},        {900, 560, 96},
                                            {1600, 1000, 150},     export_preset("column"),
                                            export_preset("wide"), export_preset("slide")};
  for (const SweepFigureKind& kind : sweep_figure_kinds())
    for (SweepMetric m : kind.metrics)
      for (const ExportOptions& page : pages) {
        const auto fig = kind.make("layout", table(), m);
        const LayoutReport report = check_layout(*fig, page);
        INFO(kind.name << " " << sweep_metric_name(m).toStdString() << " at " << page.width << "x"
                       << page.height << "@" << page.dpi);
        std::string problems;
        for (const QString& problem : report.problems) problems += problem.toStdString() + "\n";
        INFO(problems);
        CHECK(report.ok());
        CHECK(report.texts.size() > 8);
      }
}
