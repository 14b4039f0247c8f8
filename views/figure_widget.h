// Base of every view widget: follows the current state, asks the worker for
// its figure (newer requests replace stale ones), paints it, and exports it
// (figure as PNG/SVG/PDF, data as CSV) from its context menu.
#pragma once

#include <QElapsedTimer>
#include <QWidget>
#include <functional>
#include <memory>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/figure_factory.h"
#include "views/trace_service.h"
#include "views/view_options.h"

namespace kvscope::views {

class FigureWidget : public QWidget, public StateObserver {
  Q_OBJECT
 public:
  FigureWidget(const QString& name, CurrentState* state, TraceService* service,
               QWidget* parent = nullptr);
  ~FigureWidget() override;

  void state_changed(const Selection& selection, uint32_t changes) override;
  std::shared_ptr<Figure> figure() const { return figure_; }
  QString view_name() const { return name_; }
  // Posts a load for the current selection (the worker replaces stale ones).
  void reload();
  bool loading() const { return loading_; }
  QString error() const { return error_; }
  double last_frame_ms() const { return last_frame_ms_; }
  // The view's own options (its descriptor's), as its controls set them.
  const ViewOptions& view_options() const { return options_; }
  // Sets one and reloads.
  void set_option(const std::string& name, const std::string& value);
  // Exports what the widget shows; size and DPI as given.
  void export_to(const QString& path, const ExportOptions& options) const;

 signals:
  // The user asked to see this view alone in the window (context menu), or
  // to bring the other views back.
  void maximiseRequested(QString view);
  void figureLoaded();
  void loadFailed(QString error);

 protected:
  // Which changes make this view reload (default: trace, step, head, growth).
  virtual uint32_t reload_on() const;
  // The work to run on the worker for a selection: by default the view's
  // figure made from request(sel), as `kvscope export` makes it.
  virtual std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel);
  // The request for a selection: this view, its options, the widget's size.
  FigureRequest request(const Selection& sel) const;
  // Called on the GUI thread when a new figure arrived (keep view state).
  virtual void adopt(std::shared_ptr<Figure> previous) { Q_UNUSED(previous); }
  void paintEvent(QPaintEvent* event) override;
  void contextMenuEvent(QContextMenuEvent* event) override;
  QRectF area() const { return QRectF(rect()); }
  // Worker priority of this view's loads.
  int priority() const;

  CurrentState* state_;
  TraceService* service_;
  std::shared_ptr<Figure> figure_;
  ViewOptions options_;

 private:
  void export_dialog();
  void export_csv_dialog();
  QString name_;
  QString error_;
  bool loading_ = false;
  double last_frame_ms_ = 0;
};

}  // namespace kvscope::views
