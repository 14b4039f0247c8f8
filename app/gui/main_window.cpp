#include "app/gui/main_window.h"

#include "views/view_registry.h"

#include <QAction>
#include <QApplication>
#include <QCursor>
#include <QDir>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QResizeEvent>
#include <QScreen>
#include <QSettings>
#include <QShowEvent>
#include <QStatusBar>
#include <QTimer>
#include <QToolBar>
#include <QWindow>

#include <cstdio>
#include <fstream>

#include "app/gui/capture_dialog.h"
#include "app/gui/sweep_panel.h"
#include "app/gui/view_panels.h"
#include "core/analysis/perfetto.h"
#include "core/common/atomic_file.h"
#include "core/common/check.h"

namespace kvscope::gui {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent), service_(new views::TraceService(this)) {
  setWindowTitle("KVScope");
  setObjectName("mainWindow");
  setAcceptDrops(true);
  setDockNestingEnabled(true);
  // The default size fits the screen it opens on (a 1600 px wide screen too).
  const QSize avail = QGuiApplication::primaryScreen()
                          ? QGuiApplication::primaryScreen()->availableGeometry().size()
                          : QSize(1600, 1000);
  resize(QSize(1560, 960).boundedTo(avail * 0.96));
  build_docks();
  build_toolbar();
  build_menus();
  build_shortcuts();
  state_.attach(this);
  lod_label_ = new QLabel(this);
  statusBar()->addPermanentWidget(lod_label_);
  statusBar()->showMessage("Open a trace: File ▸ Open (Ctrl+O), or drop a .h5 file on the window");
  live_timer_.setInterval(500);
  connect(&live_timer_, &QTimer::timeout, this, &MainWindow::poll_live);
  live_timer_.start();
  connect(service_, &views::TraceService::lodProgress, this,
          [this](QString t, qint64 done, qint64 total) {
            lod_label_->setText(QString("building level-of-detail cache of %1: %2/%3 heads")
                                    .arg(QFileInfo(t).fileName())
                                    .arg(done)
                                    .arg(total));
            // Coarse first: the overview shows the heads built so far.
            if (t.toStdString() == state_.selection().trace && done < total) reload_lod_views();
          });
  connect(service_, &views::TraceService::lodReady, this, [this](QString t, QString cache) {
    lod_label_->setText("level-of-detail cache: " + cache);
    info_->set_lod_status(t, cache);
    if (t.toStdString() == state_.selection().trace) reload_lod_views();
  });
  connect(service_, &views::TraceService::lodFailed, this, [this](QString t, QString e) {
    lod_label_->setText("level-of-detail cache failed: " + e);
    info_->set_lod_status(t, "failed: " + e);
  });
  connect(service_, &views::TraceService::lodNotNeeded, this, [this](QString t) {
    info_->set_lod_status(t, "none (the trace has no pooled attention, or is still being written)");
  });
  // First-view timing: from open_trace() to the heatmap's first painted figure.
  // The central view is the one first painted.
  connect(central_view_, &views::FigureWidget::figureLoaded, this, [this] {
    if (timing_trace_.isEmpty() || timing_trace_.toStdString() != state_.selection().trace) return;
    central_view_->repaint();
    first_view_ms_ = double(open_clock_.nsecsElapsed()) / 1e6;
    QString t = timing_trace_;
    timing_trace_.clear();
    emit firstViewShown(t, first_view_ms_);
  });
}

MainWindow::~MainWindow() {
  state_.detach(this);
  // Views, the step bar and the trace info detach from the state in their
  // destructors: delete every child widget (docks, central widget, tool bars)
  // while the state still exists, not in ~QWidget after it is gone (ASan
  // caught the step bar in a tool bar detaching from a destroyed state).
  qDeleteAll(findChildren<QWidget*>(QString(), Qt::FindDirectChildrenOnly));
}

QDockWidget* MainWindow::add_dock(const QString& name, const QString& title, QWidget* content,
                                  Qt::DockWidgetArea where) {
  auto* d = new QDockWidget(title, this);
  d->setObjectName("dock-" + name);
  d->setWidget(content);
  addDockWidget(where, d);
  docks_[name] = d;
  return d;
}

// Every registered view (views/view_registry.cpp): its widget with its
// options row, centred or docked where the registry says, tabbed with the
// view it names; the trace-info panel shares the overview's dock.
void MainWindow::build_docks() {
  const QMap<views::DockArea, Qt::DockWidgetArea> areas = {
      {views::DockArea::Left, Qt::LeftDockWidgetArea},
      {views::DockArea::Right, Qt::RightDockWidgetArea},
      {views::DockArea::Bottom, Qt::BottomDockWidgetArea}};
  for (const views::ViewDescriptor& d : views::view_registry()) {
    views::FigureWidget* v = d.widget(&state_, service_);
    views_[d.name] = v;
    QWidget* content = panel(d.controls ? d.controls(v) : nullptr, v);
    if (d.area == views::DockArea::Central) {
      setCentralWidget(content);
      central_view_ = v;
      continue;
    }
    add_dock(d.name, d.title, content, areas.value(d.area));
    if (!d.tab_with.isEmpty()) tabifyDockWidget(docks_[d.tab_with], docks_[d.name]);
    // The trace's facts share the first left dock.
    if (d.area == views::DockArea::Left && !info_) {
      info_ = new TraceInfoPanel(&state_, service_);
      add_dock("info", "Trace info", info_, Qt::LeftDockWidgetArea);
      tabifyDockWidget(docks_[d.name], docks_["info"]);
    }
  }
  KVSCOPE_CHECK(central_view_ && info_, "the view registry has no central or no left view");
  for (const views::ViewDescriptor& d : views::view_registry())
    if (d.raised) docks_[d.name]->raise();
  for (views::FigureWidget* v : views_)
    connect(v, &views::FigureWidget::maximiseRequested, this, &MainWindow::toggle_maximised);
}

// Each view's dock starts at the share of the window its descriptor gives.
void MainWindow::fit_docks() {
  if (!maximised_.isEmpty()) return;
  QList<QDockWidget*> wide, tall;
  QList<int> widths, heights;
  for (const views::ViewDescriptor& d : views::view_registry()) {
    if (!docks_.contains(d.name)) continue;
    if (d.share.width() > 0) wide << docks_[d.name], widths << int(width() * d.share.width());
    if (d.share.height() > 0) tall << docks_[d.name], heights << int(height() * d.share.height());
  }
  resizeDocks(wide, widths, Qt::Horizontal);
  resizeDocks(tall, heights, Qt::Vertical);
}

void MainWindow::reload_lod_views() {
  for (const views::ViewDescriptor& d : views::view_registry())
    if (d.reads_lod) view(d.name)->reload();
}

void MainWindow::showEvent(QShowEvent* event) {
  QMainWindow::showEvent(event);
  if (docks_fitted_) return;
  docks_fitted_ = true;
  fit_docks();
}

// Docks keep their share of the window when it is resized (Qt keeps their
// pixel sizes and gives the central view all the change: at 1920 px the
// docks stayed ~300 px wide and their legends covered the plots).
void MainWindow::resizeEvent(QResizeEvent* event) {
  QMainWindow::resizeEvent(event);
  if (docks_fitted_ && event->oldSize().isValid() && event->oldSize() != event->size())
    QTimer::singleShot(0, this, [this] { fit_docks(); });
}

bool MainWindow::go_to_needle() {
  if (needle_.empty()) return false;
  state_.set_tokens(needle_);  // the token view scrolls to them
  statusBar()->showMessage(QString("needle: %1 tokens from token %2 selected in every view")
                               .arg(needle_.size())
                               .arg(needle_.front()),
                           6000);
  return true;
}

void MainWindow::toggle_maximised(const QString& view) {
  const bool switching = !maximised_.isEmpty();
  if (switching) {
    bool same = view == maximised_ || view.isEmpty();
    // The central view first: restoring with it hidden leaves the docks at
    // their maximised size.
    if (centralWidget()) centralWidget()->show();
    maximised_.clear();
    if (same) {
      // Deferred: restored at once, the docks came back at their maximised
      // size (the central view's show had not been laid out yet).
      QTimer::singleShot(0, this, [this] {
        restoreState(layout_before_);
        fit_docks();
      });
      return;
    }
    // Another view maximised from a maximised one: it hides the docks of the
    // layout saved before the first, which stays the one to go back to.
    restoreState(layout_before_);
  }
  if (view.isEmpty() || !views_.contains(view)) return;
  if (!switching) layout_before_ = saveState();
  maximised_ = view;
  QDockWidget* own = docks_.value(view);
  for (QDockWidget* d : docks_)
    if (d != own) d->hide();
  if (own) {
    // A dock's view: the central view gives it the room, its tab is raised.
    own->show();
    own->raise();
    if (centralWidget()) centralWidget()->hide();
  }
  statusBar()->showMessage(QString("%1 maximised: Ctrl+M or its context menu restores the layout")
                               .arg(own ? own->windowTitle() : QString("Attention")));
}

void MainWindow::build_toolbar() {
  QToolBar* tb = addToolBar("Navigation");
  tb->setObjectName("navigation");
  tb->setMovable(false);
  trace_combo_ = new QComboBox;
  trace_combo_->setObjectName("traceCombo");
  trace_combo_->setMinimumWidth(180);
  trace_combo_->setToolTip("Open traces: the current one");
  connect(trace_combo_, qOverload<int>(&QComboBox::activated), this,
          [this](int i) { open_trace(trace_combo_->itemData(i).toString()); });
  compare_combo_ = new QComboBox;
  compare_combo_->setObjectName("compareCombo");
  compare_combo_->setMinimumWidth(160);
  compare_combo_->addItem("(none)", QString());
  connect(compare_combo_, qOverload<int>(&QComboBox::activated), this,
          [this](int i) { set_compare(compare_combo_->itemData(i).toString()); });
  layer_spin_ = new QSpinBox;
  layer_spin_->setObjectName("layerSpin");
  layer_spin_->setPrefix("layer ");
  head_spin_ = new QSpinBox;
  head_spin_->setObjectName("headSpin");
  head_spin_->setPrefix("head ");
  auto pick = [this] {
    if (!syncing_) state_.set_head(layer_spin_->value(), head_spin_->value());
  };
  connect(layer_spin_, qOverload<int>(&QSpinBox::valueChanged), this, pick);
  connect(head_spin_, qOverload<int>(&QSpinBox::valueChanged), this, pick);
  step_bar_ = new StepBar(&state_);
  tb->addWidget(new QLabel(" trace "));
  tb->addWidget(trace_combo_);
  tb->addWidget(new QLabel(" compare with "));
  tb->addWidget(compare_combo_);
  tb->addSeparator();
  tb->addWidget(layer_spin_);
  tb->addWidget(head_spin_);
  tb->addSeparator();
  tb->addWidget(step_bar_);
}

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu("&File");
  file->addAction("&Open…", QKeySequence::Open, this, [this] {
    QStringList paths = QFileDialog::getOpenFileNames(
        this, "Open traces", QString(), "KVScope traces (*.h5 *.hdf5);;All files (*)");
    for (const QString& p : paths) open_trace(p);
  });
  file->addAction("Open &sweep…", this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, "Open a kvscope sweep folder");
    if (!dir.isEmpty()) open_sweep(dir);
  });
  recent_menu_ = file->addMenu("Open &recent");
  refresh_recent_menu();
  QAction* capture = file->addAction("&Capture…", this, [this] {
    auto* d = new CaptureDialog(this);
    d->setAttribute(Qt::WA_DeleteOnClose);
    connect(d, &CaptureDialog::traceStarted, this, [this](QString p) { open_trace(p); });
    d->show();
  });
  QString why;
  if (!capture_available(&why)) {
    capture->setEnabled(false);
    capture->setText("&Capture… (unavailable)");
    capture->setToolTip(why);
    capture->setStatusTip(why);
  }
  file->addAction("Export &lifetimes (Perfetto JSON)…", this, [this] {
    const views::Selection& sel = state_.selection();
    if (sel.trace.empty()) return;
    QString path = QFileDialog::getSaveFileName(this, "Export lifetimes of the current layer",
                                                QString("layer%1.perfetto.json").arg(sel.layer),
                                                "Trace-event JSON (*.json)");
    if (!path.isEmpty()) export_perfetto(path, {sel.layer});
  });
  file->addSeparator();
  file->addAction("&Quit", QKeySequence::Quit, this, &QWidget::close);
  QMenu* view = menuBar()->addMenu("&View");
  QAction* needle = view->addAction("Go to &needle", this, [this] {
    if (!go_to_needle()) statusBar()->showMessage("this trace has no needle tokens", 4000);
  });
  needle->setShortcut(Qt::CTRL | Qt::Key_N);
  view->addAction("&Maximise / restore the view under the mouse (Ctrl+M)", this, [this] {
    toggle_maximised(maximised_.isEmpty() ? QString("heatmap") : QString());
  });
  view->addSeparator();
  for (QDockWidget* d : docks_) view->addAction(d->toggleViewAction());
}

void MainWindow::build_shortcuts() {
  auto add = [this](const QKeySequence& key, std::function<void()> fn) {
    auto* a = new QAction(this);
    a->setShortcut(key);
    a->setShortcutContext(Qt::WindowShortcut);
    connect(a, &QAction::triggered, this, fn);
    addAction(a);
  };
  add(Qt::Key_Right, [this] { step_bar_->step_by(1); });
  add(Qt::Key_Left, [this] { step_bar_->step_by(-1); });
  add(Qt::SHIFT | Qt::Key_Right, [this] { step_bar_->step_by(10); });
  add(Qt::SHIFT | Qt::Key_Left, [this] { step_bar_->step_by(-10); });
  add(Qt::Key_Home, [this] { state_.set_step(0); });
  add(Qt::Key_End, [this] { state_.set_step(state_.selection().n_steps - 1); });
  add(Qt::Key_Space, [this] { step_bar_->set_playing(!step_bar_->playing()); });
  add(Qt::Key_Down,
      [this] { state_.set_head(state_.selection().layer, state_.selection().head + 1); });
  add(Qt::Key_Up,
      [this] { state_.set_head(state_.selection().layer, state_.selection().head - 1); });
  add(Qt::Key_PageDown,
      [this] { state_.set_head(state_.selection().layer + 1, state_.selection().head); });
  add(Qt::Key_PageUp,
      [this] { state_.set_head(state_.selection().layer - 1, state_.selection().head); });
  // Ctrl+M: the view under the mouse alone in the window, or back.
  add(Qt::CTRL | Qt::Key_M, [this] {
    if (!maximised_.isEmpty()) return toggle_maximised("");
    for (QWidget* w = QApplication::widgetAt(QCursor::pos()); w; w = w->parentWidget())
      if (auto* v = qobject_cast<views::FigureWidget*>(w)) return toggle_maximised(v->view_name());
    toggle_maximised("heatmap");
  });
}

void MainWindow::open_trace(const QString& given, bool make_current) {
  QString path = QFileInfo(given).absoluteFilePath();
  if (make_current) {
    open_clock_.start();
    timing_trace_ = path;
  }
  statusBar()->showMessage("opening " + path + " …");
  // The header is read on the worker like everything else; the UI never waits.
  service_->request<Header>(
      path.toStdString(), "open:" + path,
      [](views::TraceData& d) {
        const trace::TraceReader& r = d.reader();
        Header h;
        h.path = r.path();
        h.layers = r.n_layers();
        h.heads = r.n_heads();
        h.kv_heads = r.n_kv_heads();
        h.steps = r.n_steps();
        h.tokens = r.n_tokens();
        h.complete = r.complete();
        const trace::RunInfo& run = r.run();
        if (!run.task_kind.empty()) {
          h.task = QString::fromStdString(run.task_kind);
          h.expected = QString::fromStdString(run.expected_answer);
          h.answer = QString::fromStdString(r.generated_text()).simplified();
          h.success = r.task_success();
        }
        const std::vector<uint8_t> roles = r.token_roles(0, h.tokens);
        for (size_t t = 0; t < roles.size(); ++t)
          if (roles[t] == uint8_t(trace::TokenRole::Needle)) h.needle.push_back(int64_t(t));
        return h;
      },
      [this, make_current](Header h) { activate(h, make_current); }, this,
      [this, path](QString error) {
        statusBar()->showMessage("cannot open " + path);
        timing_trace_.clear();
        emit openFailed(path, error);
        auto* box = new QMessageBox(QMessageBox::Warning, "Cannot open trace", error,
                                    QMessageBox::Ok, this);
        box->setAttribute(Qt::WA_DeleteOnClose);
        box->open();
      });
}

void MainWindow::activate(const Header& h, bool make_current) {
  QString path = QString::fromStdString(h.path);
  if (!traces_.contains(path)) {
    traces_ << path;
    trace_combo_->addItem(QFileInfo(path).fileName(), path);
    compare_combo_->addItem(QFileInfo(path).fileName(), path);
  }
  complete_[path] = h.complete;
  remember_recent(path);
  if (!make_current) {
    if (h.complete) service_->ensure_lod(h.path);
    statusBar()->showMessage("opened " + path + " (to compare with)");
    emit traceOpened(path);
    return;
  }
  trace_combo_->setCurrentIndex(trace_combo_->findData(path));
  // The task's outcome in the title bar: what the researcher came to debug.
  QString title = "KVScope — " + QFileInfo(path).fileName();
  if (!h.task.isEmpty()) {
    QString answer = h.answer.size() > 40 ? h.answer.left(40) + "…" : h.answer;
    title += QString(" — %1: expected %2, answered \"%3\" (%4)")
                 .arg(h.task, h.expected, answer,
                      h.success == 1   ? "found"
                      : h.success == 0 ? "missed"
                                       : "unfinished");
  }
  setWindowTitle(title);
  needle_ = h.needle;
  state_.set_trace(h.path, h.layers, h.heads, h.kv_heads, h.steps, h.tokens);
  if (h.complete) service_->ensure_lod(h.path);
  if (pending_.trace == path) {  // a sweep cell: its step and needle
    Pending p = std::move(pending_);
    pending_ = {};
    state_.set_step(p.step);
    state_.set_tokens(p.tokens);
    emit sweepCellShown(path);
  }
  statusBar()->showMessage(QString("%1: %2 layers, %3 heads, %4 steps, %5 tokens%6")
                               .arg(path)
                               .arg(h.layers)
                               .arg(h.heads)
                               .arg(h.steps)
                               .arg(h.tokens)
                               .arg(h.complete ? "" : " — still being written: following"));
  emit traceOpened(path);
}

bool MainWindow::open_sweep(const QString& dir) {
  if (!sweep_) {
    sweep_ = new SweepPanel(service_);
    add_dock("sweep", "Sweep", sweep_, Qt::BottomDockWidgetArea);
    connect(sweep_, &SweepPanel::openCell, this, &MainWindow::open_at);
  }
  try {
    sweep_->open(QFileInfo(dir).absoluteFilePath());
  } catch (const std::exception& e) {
    emit openFailed(dir, e.what());
    auto* box =
        new QMessageBox(QMessageBox::Warning, "Cannot open sweep", e.what(), QMessageBox::Ok, this);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
    return false;
  }
  // The grid is what the user came for: give the dock half the window.
  docks_["sweep"]->show();
  docks_["sweep"]->raise();
  resizeDocks({docks_["sweep"]}, {height() * 45 / 100}, Qt::Vertical);
  resizeDocks({docks_["sweep"]}, {width() * 55 / 100}, Qt::Horizontal);
  statusBar()->showMessage("sweep " + dir + ": click a cell to open its trace");
  return true;
}

void MainWindow::open_at(const QString& trace, qint64 step, std::vector<int64_t> tokens) {
  const QString path = QFileInfo(trace).absoluteFilePath();
  pending_ = {path, step, std::move(tokens)};
  if (path.toStdString() == state_.selection().trace) {  // already current
    Pending p = std::move(pending_);
    pending_ = {};
    state_.set_step(p.step);
    state_.set_tokens(p.tokens);
    emit sweepCellShown(path);
    return;
  }
  open_trace(path);
}

void MainWindow::set_compare(const QString& path) {
  compare_combo_->setCurrentIndex(std::max(0, compare_combo_->findData(path)));
  state_.set_compare(path.toStdString());
  if (!path.isEmpty()) docks_["compare"]->raise();
}

void MainWindow::state_changed(const views::Selection& sel, uint32_t) {
  sync_pickers(sel);
}

void MainWindow::sync_pickers(const views::Selection& sel) {
  syncing_ = true;
  layer_spin_->setRange(0, int(std::max<int64_t>(0, sel.n_layers - 1)));
  head_spin_->setRange(0, int(std::max<int64_t>(0, sel.n_heads - 1)));
  layer_spin_->setValue(sel.layer);
  head_spin_->setValue(sel.head);
  syncing_ = false;
}

void MainWindow::poll_live() {
  // Every trace still being written is refreshed on the worker; the current
  // one's new extent is announced to all views.
  for (const QString& path : traces_) {
    if (complete_.value(path, true)) continue;
    service_->request<std::tuple<int64_t, int64_t, bool>>(
        path.toStdString(), "refresh:" + path,
        [](views::TraceData& d) {
          d.refresh();
          return std::make_tuple(d.reader().n_steps(), d.reader().n_tokens(),
                                 d.reader().complete());
        },
        [this, path](std::tuple<int64_t, int64_t, bool> r) {
          auto [steps, tokens, complete] = r;
          complete_[path] = complete;
          if (path.toStdString() != state_.selection().trace) return;
          state_.set_extent(steps, tokens);
          if (complete) {
            statusBar()->showMessage(QString("%1: capture finished: %2 steps, %3 tokens")
                                         .arg(path)
                                         .arg(steps)
                                         .arg(tokens));
            service_->ensure_lod(path.toStdString());
          } else {
            statusBar()->showMessage(QString("%1: %2 steps, %3 tokens — still being written: "
                                             "following")
                                         .arg(path)
                                         .arg(steps)
                                         .arg(tokens));
          }
        },
        this);
  }
}

void MainWindow::export_perfetto(const QString& path, std::vector<int> layers) {
  statusBar()->showMessage("writing " + path + " …");
  std::string out = path.toStdString();
  service_->request<int64_t>(
      state_.selection().trace, "perfetto",
      [out, layers](views::TraceData& d) {
        analysis::PerfettoOptions o;
        o.layers = layers;
        int64_t n = 0;
        write_stream_atomically(
            out, [&](std::ostream& f) { n = analysis::write_perfetto_json(d.reader(), o, f); },
            "the Perfetto trace");
        return n;
      },
      [this, path](int64_t n) {
        statusBar()->showMessage(QString("wrote %1 (%2 trace events)").arg(path).arg(n));
        emit perfettoWritten(path);
      },
      this, [this](QString e) { statusBar()->showMessage("Perfetto export failed: " + e); });
}

QStringList MainWindow::recent_files() const {
  return QSettings("KVScope", "kvscope-gui").value("recent").toStringList();
}

void MainWindow::remember_recent(const QString& path) {
  QStringList r = recent_files();
  r.removeAll(path);
  r.prepend(path);
  while (r.size() > 10) r.removeLast();
  QSettings("KVScope", "kvscope-gui").setValue("recent", r);
  refresh_recent_menu();
}

void MainWindow::refresh_recent_menu() {
  recent_menu_->clear();
  for (const QString& p : recent_files())
    recent_menu_->addAction(p, this, [this, p] { open_trace(p); });
  recent_menu_->setEnabled(!recent_menu_->isEmpty());
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
  if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
  for (const QUrl& url : e->mimeData()->urls())
    if (url.isLocalFile()) open_trace(url.toLocalFile());
  e->acceptProposedAction();
}

QStringList MainWindow::save_screenshots(const QString& dir) {
  QDir().mkpath(dir);
  QStringList written;
  QApplication::processEvents();
  // The whole window as the X server shows it (a real window under Xvfb);
  // offscreen platforms have no server to ask, so fall back to grab().
  QPixmap win;
  if (QScreen* screen = windowHandle() ? windowHandle()->screen() : nullptr;
      screen && QGuiApplication::platformName() == "xcb")
    win = screen->grabWindow(winId());
  if (win.isNull()) win = grab();
  if (win.save(dir + "/main-window.png")) written << dir + "/main-window.png";
  // Each view on its own at a readable size: float its dock, grab, dock it back.
  for (auto it = docks_.begin(); it != docks_.end(); ++it) {
    QDockWidget* d = it.value();
    d->setFloating(true);
    d->resize(1200, 760);
    d->show();
    d->raise();
    for (int i = 0; i < 3; ++i) QApplication::processEvents();
    QPixmap pix = d->widget()->grab();
    d->setFloating(false);
    QString file = dir + "/view-" + it.key() + ".png";
    if (pix.save(file)) written << file;
  }
  QApplication::processEvents();
  QPixmap heat = centralWidget()->grab();
  if (heat.save(dir + "/view-heatmap.png")) written << dir + "/view-heatmap.png";
  return written;
}

}  // namespace kvscope::gui
