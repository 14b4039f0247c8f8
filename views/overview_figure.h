// The layer x head overview (BertViz's grid, at any size): one thumbnail of
// the pooled attention map per query head, drawn from the level-of-detail
// cache; heads of each layer sorted by a metric; a click drills into a head.
#pragma once

#include <QImage>
#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

enum class OverviewMetric { Head, SinkMass, LocalMass, Entropy, Occupancy, LostMass };
QStringList overview_metric_names();

class OverviewFigure : public Figure {
 public:
  static std::shared_ptr<OverviewFigure> load(TraceData& data, const Selection& sel,
                                              OverviewMetric metric);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  // (layer, query head) under a point, or (-1, -1).
  std::pair<int, int> head_at(const QRectF& area, const QPointF& point) const;
  // Column of `head` within its layer's sorted row.
  int column_of(int layer, int head) const;

  OverviewMetric metric = OverviewMetric::Head;
  int layer = 0, head = 0;
  int64_t layers = 0, heads = 0, step = 0;
  bool thumbnails = false;  // the LOD cache was there
  QString note;
  std::vector<QImage> thumbs;           // L*H (null when none)
  std::vector<float> values;            // L*H metric values
  std::vector<std::vector<int>> order;  // per layer: heads, best first
  std::vector<int64_t> windows;         // per layer: sliding window, 0 = global (/run)

  // The grid of cells within a figure area.
  QRectF grid(const QRectF& area) const;

 private:
  QRectF cell(const QRectF& grid, int layer, int column) const;
  void paint_axes(QPainter& p, const QRectF& grid) const;
};

}  // namespace kvscope::views
