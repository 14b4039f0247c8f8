// Interactive attention heatmap: wheel zooms about the cursor, drag pans,
// double-click resets; every frame repaints from the grids already in memory
// (cost follows pixels) while the detail grid for the new viewport is
// requested from the worker, newest request winning.
#pragma once

#include "views/figure_widget.h"
#include "views/heatmap_figure.h"

namespace kvscope::views {

// The heatmap's options as a request carries them, and back (lossless).
ViewOptions heatmap_view_options(const HeatmapOptions& options);
HeatmapOptions heatmap_options(const ViewOptions& options);

class HeatmapView : public FigureWidget {
  Q_OBJECT
 public:
  HeatmapView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  HeatmapFigure* heatmap() const { return static_cast<HeatmapFigure*>(figure_.get()); }
  void set_options(const HeatmapOptions& options);
  const HeatmapOptions& options() const { return heatmap_options_; }
  // Zooms by `factor` (< 1 zooms in) about a widget point; pans by pixels.
  void zoom_at(const QPointF& point, double factor);
  void pan_by(const QPointF& pixels);
  void reset_view();
  int64_t detail_requests() const { return detail_requests_; }

 protected:
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  // A new token selection is marked at once, without a reload.
  void state_changed(const Selection& selection, uint32_t changes) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;

 private:
  void viewport_changed();
  QSizeF plot_pixels() const;
  HeatmapOptions heatmap_options_;
  QPointF drag_from_;
  bool dragging_ = false;
  int64_t detail_requests_ = 0;
};

}  // namespace kvscope::views
