// The real main window end to end: open, keyboard stepping, overview drill
// in, drag and drop, compare, live follow of a trace another process is
// writing, screenshots and exports. Runs in a real X server under xvfb-run
// (scripts/test); offscreen when no DISPLAY is set.
#include <QComboBox>
#include <QDragEnterEvent>
#include <QFileInfo>
#include <QGuiApplication>
#include <QLineEdit>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QProcess>
#include <QScreen>
#include <QSignalSpy>
#include <QTest>
#include <QTextBrowser>
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>

#include "app/gui/capture_dialog.h"
#include "app/gui/main_window.h"
#include "app/gui/sweep_panel.h"
#include "core/analysis/why.h"
#include "core/sweep/results_table.h"
#include "core/trace/synthetic.h"
#include "tests/support/paths.h"
#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/budget_figure.h"
#include "views/compare_figure.h"
#include "views/heatmap_view.h"
#include "views/layout_check.h"
#include "views/overview_figure.h"
#include "views/overview_view.h"
#include "views/pareto_figure.h"
#include "views/sweep_figure.h"
#include "views/timeline_view.h"

using namespace kvscope;
using gui::MainWindow;

namespace {

constexpr int kWaitMs = 60000;  // generous: a loaded CI machine is slow, never a timed assertion

void setup() {
  // Settings (the recent-files list) go to a folder of this process's own:
  // CTest runs several GUI tests at once, and a shared ~/.qttest/config let
  // one test's recent file land in another's list. QSettings reads
  // XDG_CONFIG_HOME on first use, so this runs before any window exists.
  static const bool isolated = [] {
    return qputenv("XDG_CONFIG_HOME", QByteArray::fromStdString(test::temp_dir() + "/config"));
  }();
  (void)isolated;
  test::qt_app(false);
}

bool all_loaded(MainWindow& w) {
  for (views::FigureWidget* v : w.all_views()) {
    if (v->view_name() == "compare" && w.state().selection().compare.empty()) continue;
    if (v->loading() || (!v->figure() && v->error().isEmpty())) return false;
  }
  return true;
}

// Whether the kvscope beside the tests lists `command` in its --help (a
// build without the capture engine has none); warns, visibly, when not.
bool kvscope_has(const std::string& command) {
  std::string help;
  test::run_command(test::kvscope_exe() + " --help", &help);
  if (help.find("\n  " + command + " ") != std::string::npos) return true;
  WARN("NOT RUN: this build's kvscope has no `" + command + "` command");
  return false;
}

// A small trace; with `needle`, a retrieval task's marks: tokens 50-57 and
// the last 6 prompt tokens.
std::string synthetic(const std::string& dir, const std::string& name, int window = 16,
                      bool needle = false) {
  trace::SyntheticSpec spec = test::small_spec();
  spec.prompt_tokens = 120;
  spec.decode_steps = 40;
  spec.prefill_chunk = 30;
  spec.window = window;
  spec.tiers = 2;
  spec.pooled_block = 4;
  if (needle) spec = test::with_needle(spec, 50, 8, 6);
  std::string path = dir + "/" + name;
  trace::write_synthetic_trace(path, spec);
  return path;
}

}  // namespace

TEST_CASE(
    "main window: open, step with the keyboard, drill in, drop, compare, screenshot, export") {
  setup();
  std::string dir = test::temp_dir();
  std::string a = synthetic(dir, "a.h5"), b = synthetic(dir, "b.h5", 8);
  MainWindow w;
  w.show();
  REQUIRE(QTest::qWaitForWindowExposed(&w));
  w.activateWindow();
  QSignalSpy opened(&w, &MainWindow::traceOpened);
  QSignalSpy first_view(&w, &MainWindow::firstViewShown);
  w.open_trace(QString::fromStdString(a));
  REQUIRE(opened.wait(kWaitMs));
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  const views::Selection& sel = w.state().selection();
  CHECK(sel.n_steps == 4 + 40);
  CHECK(sel.step == sel.n_steps - 1);
  if (first_view.isEmpty()) REQUIRE(first_view.wait(kWaitMs));
  CHECK(w.first_view_ms() > 0);
  CHECK(w.recent_files().value(0) == QString::fromStdString(a));

  // Keyboard stepping through the window's shortcuts, as a user presses keys.
  QTest::keyClick(w.windowHandle(), Qt::Key_Home);
  CHECK(sel.step == 0);
  QTest::keyClick(w.windowHandle(), Qt::Key_Right);
  QTest::keyClick(w.windowHandle(), Qt::Key_Right);
  CHECK(sel.step == 2);
  QTest::keyClick(w.windowHandle(), Qt::Key_Right, Qt::ShiftModifier);
  CHECK(sel.step == 12);
  CHECK(w.step_bar()->slider()->value() == 12);
  QTest::keyClick(w.windowHandle(), Qt::Key_End);
  CHECK(sel.step == sel.n_steps - 1);
  QTest::keyClick(w.windowHandle(), Qt::Key_PageDown);
  CHECK(sel.layer == 1);

  // Drill in from the overview: every other view follows the new head.
  auto* overview = static_cast<views::OverviewView*>(w.view("overview"));
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  w.dock("overview")->raise();
  QRectF area(overview->rect());
  auto* overview_figure = dynamic_cast<views::OverviewFigure*>(overview->figure().get());
  REQUIRE(overview_figure);
  QRectF plot = overview_figure->grid(area);
  overview->click_at(
      QPointF(plot.left() + 5.5 / 8 * plot.width(), plot.top() + 2.5 / 4 * plot.height()));
  CHECK(sel.layer == 2);
  CHECK(sel.head == 5);
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  auto* heat = static_cast<views::HeatmapView*>(w.view("heatmap"));
  CHECK(heat->heatmap()->layer == 2);
  CHECK(heat->heatmap()->head == 5);
  CHECK(heat->heatmap()->kv_head == 2);

  // Drag and drop a second trace onto the window.
  auto* mime = new QMimeData;
  mime->setUrls({QUrl::fromLocalFile(QString::fromStdString(b))});
  QDragEnterEvent enter(QPoint(100, 100), Qt::CopyAction, mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(&w, &enter);
  CHECK(enter.isAccepted());
  QDropEvent drop(QPointF(100, 100), Qt::CopyAction, mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(&w, &drop);
  REQUIRE(opened.wait(kWaitMs));
  CHECK(w.open_traces().size() == 2);
  CHECK(sel.trace == QFileInfo(QString::fromStdString(b)).absoluteFilePath().toStdString());
  delete mime;

  // Back to A, compared with B.
  w.open_trace(QString::fromStdString(a));
  REQUIRE(opened.wait(kWaitMs));
  w.set_compare(QString::fromStdString(
      QFileInfo(QString::fromStdString(b)).absoluteFilePath().toStdString()));
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w) && w.view("compare")->figure(); }, kWaitMs));
  auto* cmp = dynamic_cast<views::CompareFigure*>(w.view("compare")->figure().get());
  REQUIRE(cmp);
  int64_t only_a = 0;
  for (const auto& h : cmp->heads) only_a += h.only_a;
  CHECK(only_a > 0);  // A's window is 8 tokens longer at every head
  // Selected tokens become the compare view's focus span.
  w.state().set_tokens({60, 61, 62});
  REQUIRE(QTest::qWaitFor(
      [&] {
        auto* c = dynamic_cast<views::CompareFigure*>(w.view("compare")->figure().get());
        return c && c->span_name == "selection";
      },
      kWaitMs));
  CHECK(dynamic_cast<views::CompareFigure*>(w.view("compare")->figure().get())->span ==
        std::vector<int64_t>{60, 61, 62});

  // Screenshots of the window and every view, and an export from the GUI.
  std::string shots = test::temp_dir();
  QStringList files = w.save_screenshots(QString::fromStdString(shots));
  CHECK(files.size() == w.all_views().size() + 2);  // window + docks (incl. info) + heatmap
  QImage window(QString::fromStdString(shots) + "/main-window.png");
  REQUIRE(!window.isNull());
  // A real window, not a sliver: 800 px, or most of a smaller screen (the
  // offscreen platform's is 800 px wide, and the window fits the screen).
  const int screen_w = QGuiApplication::primaryScreen()->availableGeometry().width();
  CHECK(window.width() >= std::min(800, screen_w * 9 / 10));
  QSet<QRgb> colours;
  for (int y = 0; y < window.height(); y += 9)
    for (int x = 0; x < window.width(); x += 9) colours.insert(window.pixel(x, y));
  CHECK(colours.size() > 50);
  std::string svg = shots + "/heatmap.svg";
  w.view("heatmap")->export_to(QString::fromStdString(svg), views::ExportOptions{1200, 900, 120});
  std::ifstream in(svg);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text.find("<svg") != std::string::npos);
  CHECK(text.find("layer 2") != std::string::npos);
  QSignalSpy perfetto(&w, &MainWindow::perfettoWritten);
  std::string json = shots + "/lifetimes.json";
  w.export_perfetto(QString::fromStdString(json), {2});
  REQUIRE(perfetto.wait(kWaitMs));
  std::ifstream pj(json);
  std::string events((std::istreambuf_iterator<char>(pj)), {});
  CHECK(events.find("\"traceEvents\"") != std::string::npos);
  CHECK(events.find("kv head 3") != std::string::npos);
}

// The layout test's window half: at three window sizes, every view in its
// dock (raised in turn) gets a fair share of the window and draws no text
// clipped or overlapping at the size it has there; maximising a view gives
// it the window and restoring brings the layout back.
TEST_CASE("main window layout: every view fits its dock at 1280x800, 1600x1000 and 1920x1080") {
  setup();
  std::string dir = test::temp_dir();
  std::string a = synthetic(dir, "a.h5", 16, true), b = synthetic(dir, "b.h5", 8, true);
  MainWindow w;
  w.show();
  REQUIRE(QTest::qWaitForWindowExposed(&w));
  QSignalSpy opened(&w, &MainWindow::traceOpened);
  w.open_trace(QString::fromStdString(a));
  REQUIRE(opened.wait(kWaitMs));
  w.set_compare(QString::fromStdString(
      QFileInfo(QString::fromStdString(b)).absoluteFilePath().toStdString()));
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w) && w.view("compare")->figure(); }, kWaitMs));
  for (QSize size : {QSize(1280, 800), QSize(1600, 1000), QSize(1920, 1080)}) {
    w.resize(size);
    QTest::qWait(0);
    (void)QTest::qWaitFor([&] { return w.size() == size; }, 5000);
    INFO("asked " << size.width() << "x" << size.height() << ", got " << w.width() << "x"
                  << w.height() << "; minimum " << w.minimumSizeHint().width() << "x"
                  << w.minimumSizeHint().height());
    REQUIRE(w.size() == size);
    REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
    QCoreApplication::processEvents();
    for (views::FigureWidget* v : w.all_views()) {
      QString name = v->view_name();
      if (QDockWidget* d = w.dock(name)) d->raise();
      QCoreApplication::processEvents();
      INFO("window " << size.width() << "x" << size.height() << " · view " << name.toStdString()
                     << " at " << v->width() << "x" << v->height());
      REQUIRE(v->figure());
      // A fair share: no dock squeezed to a strip.
      CHECK(v->width() >= size.width() / 5);
      CHECK(v->height() >= size.height() / 6);
      views::LayoutReport report = views::check_layout(*v->figure(), {v->width(), v->height(), 96});
      for (const QString& problem : report.problems) UNSCOPED_INFO(problem.toStdString());
      CHECK(report.problems.empty());
    }
  }
  // Go to needle: the needle's tokens selected in every view.
  REQUIRE(w.go_to_needle());
  CHECK(w.state().selection().tokens == std::vector<int64_t>{50, 51, 52, 53, 54, 55, 56, 57});
  // Maximise the budget view: it takes (almost) the whole window; restore.
  views::FigureWidget* budget = w.view("budget");
  w.dock("budget")->raise();
  QCoreApplication::processEvents();
  int before = w.dock("budget")->width();
  w.toggle_maximised("budget");
  QCoreApplication::processEvents();
  REQUIRE(QTest::qWaitFor([&] { return budget->width() > w.width() * 0.8; }, kWaitMs));
  CHECK(w.maximised_view() == "budget");
  CHECK_FALSE(w.dock("timeline")->isVisible());
  // Maximising another view from there swaps them, and stays swapped once
  // the event loop has run.
  w.toggle_maximised("timeline");
  REQUIRE(QTest::qWaitFor([&] { return w.view("timeline")->width() > w.width() * 0.8; }, kWaitMs));
  CHECK(w.maximised_view() == "timeline");
  CHECK_FALSE(w.dock("budget")->isVisible());
  w.toggle_maximised("timeline");
  REQUIRE(QTest::qWaitFor([&] { return w.dock("timeline")->isVisible(); }, kWaitMs));
  CHECK(w.maximised_view().isEmpty());
  (void)QTest::qWaitFor([&] { return std::abs(w.dock("budget")->width() - before) < 40; }, 5000);
  INFO("budget dock " << before << " px wide before, " << w.dock("budget")->width() << " after");
  CHECK(std::abs(w.dock("budget")->width() - before) < 40);
}

TEST_CASE("main window follows a trace another process is still writing") {
  setup();
  std::string dir = test::temp_dir();
  std::string path = dir + "/live.h5", go = dir + "/go";
  QProcess writer;
  writer.start(KVSCOPE_LIVE_WRITER,
               {QString::fromStdString(path), "6", "30", QString::fromStdString(go)});
  REQUIRE(writer.waitForStarted());
  REQUIRE(QTest::qWaitFor(
      [&] { return QFileInfo::exists(QString::fromStdString(path + ".ready")); }, kWaitMs));
  MainWindow w;
  w.show();
  QSignalSpy opened(&w, &MainWindow::traceOpened);
  w.open_trace(QString::fromStdString(path));
  REQUIRE(opened.wait(kWaitMs));
  const views::Selection& sel = w.state().selection();
  CHECK(sel.n_steps == 6);
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  REQUIRE(w.step_bar()->following());
  std::ofstream(go) << "go\n";
  REQUIRE(QTest::qWaitFor([&] { return sel.n_steps == 30; }, kWaitMs));
  CHECK(sel.step == 29);  // "follow" jumped to the newest step
  if (writer.state() != QProcess::NotRunning) REQUIRE(writer.waitForFinished(kWaitMs));
  CHECK(writer.exitStatus() == QProcess::NormalExit);
  CHECK(writer.exitCode() == 0);
  REQUIRE(QTest::qWaitFor(
      [&] {
        auto* t = dynamic_cast<views::TimelineFigure*>(w.view("timeline")->figure().get());
        return all_loaded(w) && t && t->n_steps == 30;
      },
      kWaitMs));
}

TEST_CASE("a real stories260K capture under H2O: capture, open in the GUI, screenshot, export") {
  setup();
  if (!kvscope_has("capture")) return;
  std::string out;
  std::string dir = test::temp_dir();
  std::string trace = dir + "/real.h5";
  std::string model = test::shared_dir() + "/models/stories260K";
  int rc = test::run_command(
      test::kvscope_exe() + " capture --model " + model + "/stories260K.bin --tokenizer " + model +
          "/tok512.bin --policy h2o:heavy=24,recent=24" +
          " --prompt 'Once upon a time, there was a little girl named Lily.'" +
          " --capture events+received+pooled:4+topk:8+dense:2.3 --max-new 120 -q -o " + trace,
      &out);
  INFO(out);
  REQUIRE(rc == 0);
  // In-process: the window shows what the capture recorded.
  MainWindow w;
  w.show();
  QSignalSpy opened(&w, &MainWindow::traceOpened);
  w.open_trace(QString::fromStdString(trace));
  REQUIRE(opened.wait(kWaitMs));
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  auto reader = trace::TraceReader::open(trace);
  CHECK(reader->run().policy_name == "h2o");
  auto* timeline = dynamic_cast<views::TimelineFigure*>(w.view("timeline")->figure().get());
  REQUIRE(timeline);
  REQUIRE(timeline->head);
  // Evictions of head (0, 0) in the events table are exactly the evicted tokens of the timeline.
  std::vector<trace::Event> events = reader->events(0, reader->n_events());
  int64_t evict_events = 0;
  for (const trace::Event& e : events)
    evict_events += e.kind == trace::EventKind::Evict && e.layer == 0 && e.kv_head == 0;
  int64_t evicted = 0;
  for (int32_t s : timeline->head->lifetimes.evict_step) evicted += s >= 0;
  CHECK(evict_events > 0);
  CHECK(evicted == evict_events);
  // Budget: H2O keeps heavy + recent entries per head once the cache is full.
  auto* budget = dynamic_cast<views::BudgetFigure*>(w.view("budget")->figure().get());
  REQUIRE(budget);
  CHECK(budget->head_total(0, 0) == 48);
  // Dense head 2.3 shows token-resolution attention.
  w.state().set_head(2, 3);
  REQUIRE(QTest::qWaitFor([&] { return all_loaded(w); }, kWaitMs));
  auto* heat = static_cast<views::HeatmapView*>(w.view("heatmap"));
  CHECK(heat->heatmap()->dense_index == 0);
  std::string shots = dir + "/shots";
  CHECK(w.save_screenshots(QString::fromStdString(shots)).size() == w.all_views().size() + 2);
  // The kvscope-gui binary end to end, and a headless export of the same trace.
  rc = test::run_command(std::string(KVSCOPE_GUI_EXE) + " " + trace +
                             " --needle --raise budget,pie" + " --screenshot-dir " + dir +
                             "/shots2 --quit",
                         &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(QFileInfo::exists(QString::fromStdString(dir + "/shots2/main-window.png")));
  // A trace with no task has no needle to select; an unknown view is named.
  CHECK(out.find("--needle: the trace marks no needle tokens") != std::string::npos);
  CHECK(out.find("--raise: no view 'pie'") != std::string::npos);
  REQUIRE(test::run_command(
              test::kvscope_exe() + " export " + trace + " --view timeline -o " + dir + "/t.pdf",
              &out) == 0);
  REQUIRE(test::run_command("pdftotext " + dir + "/t.pdf -", &out) == 0);
  CHECK(out.find("Eviction timeline") != std::string::npos);
}

TEST_CASE("the capture dialog runs kvscope capture on its device and shows why one is refused") {
  setup();
  if (!kvscope_has("capture")) return;
  // The dialog runs the kvscope beside kvscope-gui or on PATH; this test's
  // binary sits elsewhere.
  const QString app_dir = QFileInfo(QString::fromStdString(test::kvscope_exe())).absolutePath();
  qputenv("PATH", app_dir.toUtf8() + ":" + qgetenv("PATH"));
  const std::string dir = test::temp_dir(), model = test::shared_dir() + "/models/stories260K";
  gui::CaptureDialog dialog;
  auto line = [&](const char* name) {
    auto* field = dialog.findChild<QLineEdit*>(name);
    REQUIRE(field);
    return field;
  };
  line("model")->setText(QString::fromStdString(model + "/stories260K.bin"));
  line("tokenizer")->setText(QString::fromStdString(model + "/tok512.bin"));
  line("policy")->setText("h2o:heavy=8,recent=8");
  line("new tokens")->setText("12");
  const QString trace = QString::fromStdString(dir + "/dialog.kvtrace.h5");
  line("output")->setText(trace);
  auto* device = dialog.findChild<QComboBox*>("device");
  REQUIRE(device);
  CHECK(device->currentText() == "cpu");
  const QStringList args = dialog.arguments();
  CHECK(args.indexOf("--device") >= 0);
  CHECK(args.value(args.indexOf("--device") + 1) == "cpu");

  QSignalSpy finished(&dialog, &gui::CaptureDialog::captureFinished);
  QSignalSpy started(&dialog, &gui::CaptureDialog::traceStarted);
  dialog.start();
  REQUIRE(finished.wait(kWaitMs));
  auto* progress = dialog.findChild<QPlainTextEdit*>("progress");
  REQUIRE(progress);
  INFO(progress->toPlainText().toStdString());
  CHECK(finished.at(0).at(0).toInt() == 0);
  // The command it ran, quoted as a shell takes it.
  CHECK(progress->toPlainText().contains("--prompt 'Once upon a time, there was"));
  REQUIRE(QTest::qWaitFor([&] { return started.count() == 1; }, kWaitMs));
  CHECK(started.at(0).at(0).toString() == trace);
  auto reader = trace::TraceReader::open(trace.toStdString());
  CHECK(reader->run().model.device == "cpu");
  CHECK(reader->run().policy_name == "h2o");

  // A device this machine lacks: kvscope refuses before it writes, and the
  // dialog's progress box says why.
  device->setCurrentText("cuda:999");
  const QString refused = QString::fromStdString(dir + "/refused.kvtrace.h5");
  line("output")->setText(refused);
  dialog.start();
  REQUIRE(finished.wait(kWaitMs));
  CHECK(finished.at(1).at(0).toInt() == 2);
  CHECK(progress->toPlainText().contains("--device: \"cuda:999\" requested but"));
  CHECK_FALSE(QFileInfo::exists(refused));
}

namespace {

// Runs a stories260K sweep of `axes` (the plan's lines after its model and
// tokenizer) into sweep_dir; its results table.
std::vector<sweep::ResultRow> run_stories_sweep(const std::string& sweep_dir,
                                                const std::string& axes) {
  const std::string model = test::shared_dir() + "/models/stories260K", plan = sweep_dir + ".toml";
  std::ofstream(plan) << "[sweep]\nmodels = [\"" << model << "/stories260K.bin\"]\n"
                      << "tokenizer = \"" << model << "/tok512.bin\"\n"
                      << axes;
  std::string out;
  REQUIRE(test::run_command(test::kvscope_exe() + " sweep " + plan + " -o " + sweep_dir, &out) ==
          0);
  return sweep::read_results_csv(sweep::results_csv_path(sweep_dir));
}

// Shows the window with the sweep in its dock; the canvas, once laid out.
gui::SweepCanvas* show_sweep(MainWindow& w, const std::string& sweep_dir) {
  w.show();
  REQUIRE(QTest::qWaitForWindowExposed(&w));
  REQUIRE(w.open_sweep(QString::fromStdString(sweep_dir)));
  gui::SweepCanvas* canvas = w.sweep_panel()->canvas();
  REQUIRE(QTest::qWaitFor([&] { return canvas->isVisible() && canvas->width() > 100; }, kWaitMs));
  // The docks are fitted to the window after its resize events: click once
  // they have been.
  QCoreApplication::processEvents();
  QCoreApplication::processEvents();
  return canvas;
}

}  // namespace

TEST_CASE(
    "a real stories260K sweep in the Sweep dock: a click opens the cell's trace at the "
    "divergence step with the needle selected, and explains it") {
  setup();
  if (!kvscope_has("sweep")) return;
  std::string out;
  const std::string dir = test::temp_dir(), sweep_dir = dir + "/sweep";
  const std::vector<sweep::ResultRow> rows =
      run_stories_sweep(sweep_dir,
                        "max_new = 6\npolicies = [\"full\", \"streaming_llm:sinks=4,window=32\"]\n"
                        "tasks = [\"needle\"]\nlengths = [200]\ndepths = [0.1, 0.9]\n");
  REQUIRE(rows.size() == 4);
  const sweep::ResultRow* lost = nullptr;  // StreamingLLM with the needle early: evicted
  for (const sweep::ResultRow& r : rows)
    if (r.policy != "full" && r.depth.value_or(1) < 0.5) lost = &r;
  REQUIRE(lost);
  MainWindow w;
  gui::SweepCanvas* canvas = show_sweep(w, sweep_dir);
  QRectF cell = canvas->figure()->cell_area(QRectF(canvas->rect()), lost->cell_id);
  REQUIRE(!cell.isEmpty());
  QSignalSpy shown(&w, &MainWindow::sweepCellShown);
  QTest::mouseClick(canvas, Qt::LeftButton, {}, cell.center().toPoint());
  REQUIRE(shown.wait(kWaitMs));
  // The trace, step and selection are what `kvscope why` says about the cell.
  const std::string trace = sweep_dir + "/" + lost->trace;
  auto reader = trace::TraceReader::open(trace);
  const analysis::WhyReport why = analysis::explain_retrieval(*reader, 0.1);
  const views::Selection& sel = w.state().selection();
  CHECK(QFileInfo(QString::fromStdString(sel.trace)).canonicalFilePath() ==
        QFileInfo(QString::fromStdString(trace)).canonicalFilePath());
  CHECK(sel.step ==
        (why.divergence_step >= 0 ? why.divergence_step : std::max<int64_t>(0, why.answer_step)));
  std::vector<int64_t> needle;
  for (const analysis::NeedleToken& t : why.needle) needle.push_back(t.token);
  std::sort(needle.begin(), needle.end());
  CHECK(!needle.empty());
  CHECK(sel.tokens == needle);
  const QString text = w.findChild<QTextBrowser*>("sweepWhy")->toPlainText();
  CHECK(text.contains(QString::fromStdString(lost->cell_id)));
  CHECK(text.contains("verdict"));
  // The same grid exported headless: the policies named, and the cells painted.
  REQUIRE(test::run_command(test::kvscope_exe() + " export " + sweep_dir +
                                " --view sweep --metric needle-survival -o " + dir + "/grid.pdf",
                            &out) == 0);
  REQUIRE(test::run_command("pdftotext " + dir + "/grid.pdf -", &out) == 0);
  CHECK(out.find("streaming_llm:sinks=4,window=32") != std::string::npos);
  CHECK(out.find("needle survival") != std::string::npos);
  // A lost needle is drawn as missed (vermillion): most of the cell, around
  // its label, at whatever size the window got (Xvfb or offscreen).
  const QImage shot = canvas->grab().toImage().scaled(canvas->size());
  cell = canvas->figure()->cell_area(QRectF(canvas->rect()), lost->cell_id);
  int vermillion = 0, sampled = 0;
  for (double fy = 0.1; fy < 0.95; fy += 0.1)
    for (double fx = 0.1; fx < 0.95; fx += 0.1, ++sampled) {
      const QColor c = shot.pixelColor(
          QPointF(cell.left() + fx * cell.width(), cell.top() + fy * cell.height()).toPoint());
      vermillion += c.red() > 150 && c.green() < 140 && c.blue() < 110;
    }
  INFO(vermillion << " of " << sampled << " samples vermillion, cell " << cell.width() << "x"
                  << cell.height());
  CHECK(vermillion * 2 > sampled);
}

TEST_CASE(
    "a real stories260K budgets sweep as a memory curve in the Sweep dock: a click on a "
    "point opens that budget's trace, exported headless with its data") {
  setup();
  if (!kvscope_has("sweep")) return;
  std::string out;
  const std::string dir = test::temp_dir(), sweep_dir = dir + "/budgets";
  const std::vector<sweep::ResultRow> rows =
      run_stories_sweep(sweep_dir,
                        "max_new = 4\npolicies = [\"full\", \"snapkv:window=8\", \"tova\"]\n"
                        "budgets = [0.1, 0.5]\ntasks = [\"needle\"]\nlengths = [200]\n"
                        "depths = [0.5]\n");
  REQUIRE(rows.size() == 5);
  const sweep::ResultRow* small = nullptr;
  for (const sweep::ResultRow& r : rows)
    if (r.policy == "snapkv:window=8,budget=0.1") small = &r;
  REQUIRE(small);
  MainWindow w;
  gui::SweepCanvas* canvas = show_sweep(w, sweep_dir);
  auto* kind = w.findChild<QComboBox*>("sweepFigure");
  auto* metric = w.findChild<QComboBox*>("sweepMetric");
  REQUIRE(kind);
  REQUIRE(metric);
  CHECK_FALSE(w.sweep_panel()->show_figure("pie"));
  REQUIRE(w.sweep_panel()->show_figure("pareto"));
  CHECK(kind->currentData().toString() == "pareto");
  REQUIRE(dynamic_cast<views::ParetoFigure*>(canvas->figure().get()));
  // The curve's own metrics, the grid's choice kept where the curve has it.
  CHECK(metric->findData("kl") >= 0);
  CHECK(metric->currentData().toString() == "success");
  const QRectF mark = canvas->figure()->cell_area(QRectF(canvas->rect()), small->cell_id);
  REQUIRE(!mark.isEmpty());
  // Points sit left of the full cache's by the memory they hold.
  const sweep::ResultRow* full = nullptr;
  for (const sweep::ResultRow& r : rows)
    if (r.policy == "full") full = &r;
  REQUIRE(full);
  CHECK(mark.center().x() <
        canvas->figure()->cell_area(QRectF(canvas->rect()), full->cell_id).center().x());
  QSignalSpy shown(&w, &MainWindow::sweepCellShown);
  QTest::mouseClick(canvas, Qt::LeftButton, {}, mark.center().toPoint());
  REQUIRE(shown.wait(kWaitMs));
  CHECK(QFileInfo(QString::fromStdString(w.state().selection().trace)).canonicalFilePath() ==
        QFileInfo(QString::fromStdString(sweep_dir + "/" + small->trace)).canonicalFilePath());
  CHECK(w.findChild<QTextBrowser*>("sweepWhy")
            ->toPlainText()
            .contains(QString::fromStdString(small->cell_id)));
  // Back on the grid (the combo, as a user picks it), the metric list is the
  // grid's again.
  kind->setCurrentIndex(kind->findData("sweep"));
  CHECK(metric->findData("kl") < 0);
  CHECK(dynamic_cast<views::SweepFigure*>(canvas->figure().get()));

  // Headless: the PDF names the policies without their budgets, the CSV has
  // one line per policy and budget with the table's bytes.
  REQUIRE(test::run_command(test::kvscope_exe() + " export " + sweep_dir +
                                " --view pareto --metric needle-survival -o " + dir + "/curve.pdf",
                            &out) == 0);
  REQUIRE(test::run_command("pdftotext " + dir + "/curve.pdf -", &out) == 0);
  CHECK(out.find("snapkv:window=8") != std::string::npos);
  CHECK(out.find("KV cache held") != std::string::npos);
  REQUIRE(test::run_command(
              test::kvscope_exe() + " export " + sweep_dir + " --view pareto -o " + dir + "/c.csv",
              &out) == 0);
  std::ifstream csv(dir + "/c.csv");
  std::string header, line;
  std::getline(csv, header);
  CHECK(header == "task,policy,budget,cells,ran,kv_bytes_mean,kv_bytes_peak,score,lo,hi");
  int lines = 0;
  bool small_bytes = false;
  while (std::getline(csv, line)) {
    ++lines;
    small_bytes |= line.rfind("needle,snapkv:window=8,0.1,1,1," +
                                  std::to_string(int64_t(*small->kv_bytes_mean)) + ",",
                              0) == 0;
  }
  CHECK(lines == 5);
  CHECK(small_bytes);
  // Refused: a metric the curve does not show, an option of another view,
  // and a folder that is not a sweep's.
  CHECK(test::run_command(test::kvscope_exe() + " export " + sweep_dir +
                              " --view sweep --metric kl -o " + dir + "/x.png",
                          &out) == 2);
  CHECK(out.find("the sweep view shows no 'kl'") != std::string::npos);
  CHECK(test::run_command(test::kvscope_exe() + " export " + sweep_dir +
                              " --view pareto --colormap magma -o " + dir + "/x.png",
                          &out) == 2);
  CHECK(out.find("the pareto view takes no --colormap") != std::string::npos);
  CHECK(test::run_command(
            test::kvscope_exe() + " export " + dir + " --view pareto -o " + dir + "/x.png", &out) ==
        2);
  CHECK(out.find("results.csv") != std::string::npos);
  CHECK_FALSE(QFileInfo::exists(QString::fromStdString(dir + "/x.png")));
}
