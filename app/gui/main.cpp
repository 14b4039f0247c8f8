// kvscope-gui [TRACE...] [--compare B] [--layer L --head H --step S --token T]
//             [--needle] [--raise VIEW,...] [--sweep DIR [--sweep-figure KIND] [--sweep-cell ID]]
//             [--screenshot-dir DIR [--wait-lod] [--quit]] [--print-timing]
#include <QApplication>
#include <QCommandLineParser>
#include <QDockWidget>
#include <QFileInfo>
#include <QTimer>
#include <cstdio>
#include <cstring>

#include "app/gui/main_window.h"
#include "app/gui/sweep_panel.h"
#include "kvscope_version.h"

namespace {

struct Script {
  QString compare, shots, sweep, sweep_figure, sweep_cell;
  QStringList raise;  // views whose dock tabs are brought to the front
  int layer = -1, head = -1;
  qint64 step = -1, token = -1;
  bool wait_lod = false, quit = false, timing = false, needle = false;
};

// --raise: bring the named views' dock tabs to the front.
void raise_docks(kvscope::gui::MainWindow& w, const QStringList& names, bool warn) {
  for (const QString& name : names) {
    if (QDockWidget* d = w.dock(name)) {
      d->show();
      d->raise();
    } else if (warn && name != "heatmap") {
      std::fprintf(stderr, "kvscope-gui: --raise: no view '%s'\n", qPrintable(name));
    }
  }
}

// Applies the requested selection once the first trace is open, then (for
// screenshots) waits until every view has loaded before grabbing them.
void run_script(kvscope::gui::MainWindow& w, const Script& s) {
  auto lod_ready = std::make_shared<bool>(!s.wait_lod);
  QObject::connect(&w.service(), &kvscope::views::TraceService::lodReady, &w,
                   [lod_ready] { *lod_ready = true; });
  QObject::connect(&w.service(), &kvscope::views::TraceService::lodFailed, &w,
                   [lod_ready] { *lod_ready = true; });
  QObject::connect(&w.service(), &kvscope::views::TraceService::lodNotNeeded, &w,
                   [lod_ready] { *lod_ready = true; });
  // The compared trace becomes the compare selection as soon as it is open
  // (with or without screenshots).
  QObject::connect(&w, &kvscope::gui::MainWindow::traceOpened, &w, [&w, s](QString path) {
    if (!s.compare.isEmpty() && path == QFileInfo(s.compare).absoluteFilePath() &&
        w.state().selection().compare.empty())
      w.set_compare(path);
  });
  QObject::connect(&w, &kvscope::gui::MainWindow::firstViewShown, &w, [s](QString path, double ms) {
    if (s.timing)
      std::printf("first view of %s: %.1f ms\n", qPrintable(path), ms), std::fflush(stdout);
  });
  QObject::connect(&w, &kvscope::gui::MainWindow::openFailed, &w, [s](QString path, QString e) {
    std::fprintf(stderr, "kvscope-gui: %s\n", qPrintable(e));
    if (s.quit) QApplication::exit(2);
  });
  auto applied = std::make_shared<bool>(false);
  QObject::connect(&w, &kvscope::gui::MainWindow::traceOpened, &w, [&w, s, applied, lod_ready] {
    if (*applied) return;
    *applied = true;
    if (!s.compare.isEmpty()) w.open_trace(s.compare, false);
    const auto& sel = w.state().selection();
    w.state().set_head(s.layer >= 0 ? s.layer : sel.layer, s.head >= 0 ? s.head : sel.head);
    if (s.step >= 0) w.state().set_step(s.step);
    if (s.token >= 0) w.state().set_tokens({s.token});
    if (s.needle && !w.go_to_needle())
      std::fprintf(stderr, "kvscope-gui: --needle: the trace marks no needle tokens\n");
    raise_docks(w, s.raise, true);
    if (s.shots.isEmpty()) return;
    auto* poll = new QTimer(&w);
    poll->setInterval(200);
    QObject::connect(poll, &QTimer::timeout, &w, [&w, s, poll, lod_ready]() mutable {
      // --wait-lod: the overview's tiles come from the cache.
      if (!*lod_ready) return;
      if (!s.compare.isEmpty() && w.state().selection().compare.empty()) return;
      for (auto* v : w.all_views())
        if (v->loading()) return;
      poll->stop();
      raise_docks(w, s.raise, false);  // again: opening the compared trace raised Compare
      QStringList files = w.save_screenshots(s.shots);
      for (const QString& f : files) std::printf("screenshot %s\n", qPrintable(f));
      std::fflush(stdout);
      if (s.quit) QApplication::exit(files.isEmpty() ? 1 : 0);
    });
    QTimer::singleShot(0, &w, [poll] { poll->start(); });
  });
}

// The command line's options, declared once for both parsers.
struct Options {
  QCommandLineOption compare{"compare", "second trace to compare with", "trace"};
  QCommandLineOption layer{"layer", "layer", "n"}, head{"head", "query head", "n"};
  QCommandLineOption step{"step", "step", "n"}, token{"token", "selected token", "n"};
  QCommandLineOption shots{"screenshot-dir", "save the window and every view as PNG", "dir"};
  QCommandLineOption wait_lod{"wait-lod", "wait for the level-of-detail cache before screenshots"};
  QCommandLineOption quit{"quit", "quit after the screenshots"};
  QCommandLineOption timing{"print-timing", "print the time to the first view"};
  QCommandLineOption sweep{"sweep", "a kvscope sweep folder to show in the Sweep dock", "dir"};
  QCommandLineOption sweep_figure{
      "sweep-figure", "the Sweep dock's figure: sweep (the grid) or pareto (against KV memory)",
      "kind"};
  QCommandLineOption sweep_cell{"sweep-cell", "open this sweep cell's trace (as a click does)",
                                "cell id"};
  QCommandLineOption needle{"needle", "select the needle's tokens in every view (Go to needle)"};
  QCommandLineOption raise{"raise", "bring these views' dock tabs to the front", "view,..."};

  void add_to(QCommandLineParser& p) const {
    p.setApplicationDescription("KVScope: replay KV-cache policy traces");
    p.addHelpOption();
    p.addVersionOption();
    p.addPositionalArgument("traces", "trace files to open");
    for (const auto& o : {compare, layer, head, step, token, needle, raise, shots, wait_lod, quit,
                          timing, sweep, sweep_figure, sweep_cell})
      p.addOption(o);
  }
};

void set_identity() {
  QCoreApplication::setApplicationName("kvscope-gui");
  QCoreApplication::setOrganizationName("KVScope");
  QCoreApplication::setApplicationVersion(KVSCOPE_VERSION_STRING);
}

// --help and --version print and exit before any window exists, so they
// work without a display (over ssh, in scripts).
bool asks_only_text(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    for (const char* flag : {"-h", "--help", "--help-all", "-v", "--version", "-?"})
      if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (asks_only_text(argc, argv)) {
    QCoreApplication core(argc, argv);
    set_identity();
    QCommandLineParser p;
    Options().add_to(p);
    p.process(core);  // prints and exits
    return 0;
  }
  QApplication app(argc, argv);
  set_identity();
  QCommandLineParser p;
  const Options opt;
  opt.add_to(p);
  p.process(app);
  kvscope::gui::MainWindow w;
  Script s;
  s.compare = p.value(opt.compare);
  s.layer = p.isSet(opt.layer) ? p.value(opt.layer).toInt() : -1;
  s.head = p.isSet(opt.head) ? p.value(opt.head).toInt() : -1;
  s.step = p.isSet(opt.step) ? p.value(opt.step).toLongLong() : -1;
  s.token = p.isSet(opt.token) ? p.value(opt.token).toLongLong() : -1;
  s.shots = p.value(opt.shots);
  s.wait_lod = p.isSet(opt.wait_lod);
  s.quit = p.isSet(opt.quit);
  s.timing = p.isSet(opt.timing);
  s.sweep = p.value(opt.sweep);
  s.sweep_figure = p.value(opt.sweep_figure);
  s.sweep_cell = p.value(opt.sweep_cell);
  s.needle = p.isSet(opt.needle);
  s.raise = p.value(opt.raise).split(',', Qt::SkipEmptyParts);
  run_script(w, s);
  w.show();
  const QStringList traces = p.positionalArguments();
  if (!s.sweep.isEmpty()) {
    if (!w.open_sweep(s.sweep)) return 2;
    if (!s.sweep_figure.isEmpty() && !w.sweep_panel()->show_figure(s.sweep_figure)) {
      std::fprintf(stderr,
                   "kvscope-gui: error: --sweep-figure: '%s' is not a sweep figure (expected sweep "
                   "or pareto)\n",
                   qPrintable(s.sweep_figure));
      return 2;
    }
    if (!s.sweep_cell.isEmpty()) w.sweep_panel()->select_cell(s.sweep_cell);
  }
  if (!traces.isEmpty()) w.open_trace(traces.front());
  return app.exec();
}
