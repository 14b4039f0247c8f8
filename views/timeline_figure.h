// Eviction timeline. Head mode: a tokens x steps raster of one kv head —
// each token's row is held (coloured by tier) from admission to eviction,
// then evicted; folded to pixels on every frame, so cost follows pixels, not
// tokens x steps. Layers mode (seed 003, fig. 6): per layer, how many kv
// heads hold each token at the current step.
#pragma once

#include <QRectF>
#include <memory>

#include "core/analysis/lifetimes.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

enum class TimelineMode { Head, Layers };

class TimelineFigure : public Figure {
 public:
  static std::shared_ptr<TimelineFigure> load(TraceData& data, const Selection& sel,
                                              TimelineMode mode);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  QRectF extent() const;  // x: steps (head mode) or tokens (layers mode)
  QRectF viewport() const { return viewport_; }
  void set_viewport(const QRectF& v);
  static QRectF plot_rect(const QRectF& area);
  // Colour the head-mode raster gives a (step, token) cell (tests).
  QColor cell_color(int64_t step, int64_t token) const;

  TimelineMode mode = TimelineMode::Head;
  int layer = 0, kv_head = 0;
  int64_t step = 0, n_steps = 0, n_tokens = 0, n_kv_heads = 1, n_layers = 1, selected_token = -1;
  std::vector<QString> tier_names;
  std::shared_ptr<const analysis::HeadTimeline> head;  // head mode
  std::vector<uint16_t> counts;                        // layers mode: L x T
  std::vector<int32_t> fed_step;                       // layers mode: the step that fed token t
  std::shared_ptr<const std::vector<QString>> token_text;

 private:
  void paint_head(QPainter& p, const QRectF& plot, double device_scale) const;
  void paint_layers(QPainter& p, const QRectF& plot, double device_scale) const;
  void paint_token_columns(QPainter& p, const QRectF& plot) const;
  void paint_layer_ticks(QPainter& p, const QRectF& plot) const;
  QRectF viewport_;
};

QColor timeline_class_color(const analysis::TimelineClasses& classes, int c);

}  // namespace kvscope::views
