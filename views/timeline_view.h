// Interactive eviction timeline: wheel zooms about the cursor (Ctrl: the
// token axis), drag pans, double-click resets. Each frame folds the loaded
// lifetimes to the widget's pixels on the GUI thread — no file access.
// Clicking a token row selects that token everywhere; clicking a step
// column moves the current step.
#pragma once

#include "views/figure_widget.h"
#include "views/timeline_figure.h"

namespace kvscope::views {

class TimelineView : public FigureWidget {
  Q_OBJECT
 public:
  TimelineView(TimelineMode mode, CurrentState* state, TraceService* service,
               QWidget* parent = nullptr);
  TimelineFigure* timeline() const { return static_cast<TimelineFigure*>(figure_.get()); }
  void zoom_at(const QPointF& point, double fx, double fy);
  void pan_by(const QPointF& pixels);

 protected:
  uint32_t reload_on() const override;
  void state_changed(const Selection& selection, uint32_t changes) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;

 private:
  void follow(const Selection& sel);
  TimelineMode mode_;
  QPointF press_, last_;
  bool dragging_ = false, moved_ = false;
};

}  // namespace kvscope::views
