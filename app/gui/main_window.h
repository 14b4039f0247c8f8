// kvscope-gui's main window: dockable views around the attention heatmap,
// one CurrentState they all follow, a step scrubber, layer/head pickers,
// several open traces (combo, recent files, drag and drop), live follow of
// traces still being written, and the capture dialog.
#pragma once

#include <QComboBox>
#include <QDockWidget>
#include <QElapsedTimer>
#include <QLabel>
#include <QMainWindow>
#include <QMap>
#include <QSpinBox>
#include <QTimer>

#include "app/gui/step_bar.h"
#include "app/gui/trace_info.h"
#include "views/current_state.h"
#include "views/figure_widget.h"
#include "views/trace_service.h"

namespace kvscope::gui {

class MainWindow : public QMainWindow, public views::StateObserver {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Opens a trace (reads happen on the worker) and makes it current, or
  // only adds it to the open traces (e.g. to compare with).
  void open_trace(const QString& path, bool make_current = true);
  void set_compare(const QString& path);
  // Opens a `kvscope sweep` folder in the Sweep dock; clicking a cell opens
  // its trace at the divergence step with the needle selected. Returns false
  // (and says why in a message box) when the folder holds no results table.
  bool open_sweep(const QString& dir);
  class SweepPanel* sweep_panel() const {
    return sweep_;
  }
  // Token lifetimes of `layers` of the current trace as Perfetto JSON (on the worker).
  void export_perfetto(const QString& path, std::vector<int> layers);
  void state_changed(const views::Selection& sel, uint32_t changes) override;

  views::CurrentState& state() { return state_; }
  views::TraceService& service() { return *service_; }
  StepBar* step_bar() const { return step_bar_; }
  QStringList open_traces() const { return traces_; }
  views::FigureWidget* view(const QString& name) const { return views_.value(name); }
  QList<views::FigureWidget*> all_views() const { return views_.values(); }
  QDockWidget* dock(const QString& name) const { return docks_.value(name); }
  QStringList recent_files() const;
  // Milliseconds from open_trace() to the first painted heatmap (-1 before).
  double first_view_ms() const { return first_view_ms_; }
  // Shows one view alone in the window (all docks but its own hidden, the
  // central view too when it is a dock's); again, or with another view,
  // brings the saved layout back. "" restores.
  void toggle_maximised(const QString& view);
  QString maximised_view() const { return maximised_; }
  // Gives the docks their share of the window: left 22 % and right 34 % of
  // the width, bottom 30 % of the height, groups split evenly.
  void fit_docks();
  void reload_lod_views();
  // Selects the current trace's needle tokens (every view marks them) and
  // scrolls the token text to them; false when the trace has no needle.
  bool go_to_needle();
  // Grabs the window (from the X server when there is one) and each view
  // into `dir`; returns the files written.
  QStringList save_screenshots(const QString& dir);

 signals:
  void traceOpened(QString path);
  void sweepCellShown(QString trace);
  void openFailed(QString path, QString error);
  void firstViewShown(QString path, double ms);
  void perfettoWritten(QString path);

 protected:
  void showEvent(QShowEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  struct Header {
    std::string path;
    int64_t layers = 0, heads = 0, kv_heads = 0, steps = 0, tokens = 0;
    bool complete = false;
    // The retrieval task, when the trace has one: for the title bar.
    QString task, expected, answer;
    int success = -1;             // 1 found, 0 missed, -1 unfinished or no task
    std::vector<int64_t> needle;  // tokens with role Needle
  };
  void build_docks();
  void build_toolbar();
  void build_menus();
  void build_shortcuts();
  QDockWidget* add_dock(const QString& name, const QString& title, QWidget* content,
                        Qt::DockWidgetArea where);
  void activate(const Header& h, bool make_current);
  void poll_live();
  void remember_recent(const QString& path);
  void refresh_recent_menu();
  void sync_pickers(const views::Selection& sel);
  void open_at(const QString& trace, qint64 step, std::vector<int64_t> tokens);

  views::CurrentState state_;
  views::TraceService* service_;
  StepBar* step_bar_ = nullptr;
  TraceInfoPanel* info_ = nullptr;
  views::FigureWidget* central_view_ = nullptr;  // the registry's central view
  class SweepPanel* sweep_ = nullptr;
  // A trace to show at a step with tokens selected once it is open (a sweep cell).
  struct Pending {
    QString trace;
    qint64 step = 0;
    std::vector<int64_t> tokens;
  } pending_;
  QComboBox* trace_combo_ = nullptr;
  QComboBox* compare_combo_ = nullptr;
  QSpinBox* layer_spin_ = nullptr;
  QSpinBox* head_spin_ = nullptr;
  QLabel* lod_label_ = nullptr;
  QMenu* recent_menu_ = nullptr;
  QMap<QString, views::FigureWidget*> views_;
  QMap<QString, QDockWidget*> docks_;
  std::vector<int64_t> needle_;  // of the current trace
  QString maximised_;            // the view shown alone ("" when none)
  QByteArray layout_before_;     // saveState() before it was maximised
  bool docks_fitted_ = false;
  QStringList traces_;
  QMap<QString, bool> complete_;
  QTimer live_timer_;
  QElapsedTimer open_clock_;
  QString timing_trace_;
  double first_view_ms_ = -1;
  bool syncing_ = false;
};

}  // namespace kvscope::gui
