// Eviction cutoff: one per-step series of the current (layer, kv head) — for
// KVpop the effective score of the k-th best long-range entry — as a line over
// steps, with that head's scored decisions as points at (step, score): what
// was kept above the cutoff and what was evicted below it. Generic: any series
// of the trace, and every event of the head with a finite score, grouped by
// (kind, reason). More points than pixel columns are folded to one min-max
// segment per column, so drawing cost follows pixels.
#pragma once

#include <QLineF>
#include <QPolygonF>
#include <cmath>
#include <memory>
#include <vector>

#include "core/trace/types.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class CutoffFigure : public Figure {
 public:
  struct Decision {
    int32_t step = 0, token = 0;
    float score = 0;
    uint8_t cls = 0;  // index into classes
  };
  // One (event kind, reason) of the head's scored events, e.g. KVpop's
  // "kept: above cutoff" (Demote) or "displaced: fell below cutoff" (Evict).
  struct DecisionClass {
    trace::EventKind kind = trace::EventKind::Evict;
    uint16_t reason = 0;
    QString label;
    bool removes = false;  // Evict or Reject: the token left
    int64_t count = 0;
    QColor color;
    int marker = 0;  // 0 circle, 1 triangle down, 2 cross, 3 square, 4 diamond
  };
  // What paint draws, in pixels of `plot` (tests check it).
  struct Marks {
    std::vector<QPolygonF> line;               // the series, broken at NaN holes
    std::vector<std::vector<QPointF>> points;  // per class, one per decision (unfolded)
    std::vector<std::vector<QLineF>> bins;     // per class, min-max per pixel column (folded)
  };
  struct Layout {
    QRectF title, legend, plot;
    bool compact = false;  // short legend labels (small figures)
  };

  static std::shared_ptr<CutoffFigure> load(TraceData& data, const Selection& sel, int series = 0);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  // `device`: where the text is drawn (its DPI sizes the fonts); null: the screen.
  Layout layout(const QRectF& area, const QPaintDevice* device = nullptr) const;
  // `columns`: pixel columns of the plot (device pixels); more data is folded.
  Marks marks(const QRectF& plot, int columns) const;
  plot::Map x_map(const QRectF& plot) const;
  plot::Map y_map(const QRectF& plot) const;
  // The decision drawn nearest `point` within `radius` pixels (-1: none).
  int64_t decision_at(const QRectF& area, const QPointF& point, double radius = 8) const;

  int layer = 0, kv_head = 0, series = -1;
  int64_t step = 0, n_steps = 0, selected_token = -1;
  QStringList series_names;
  QString series_name, meaning, units;
  std::vector<float> values;               // per step, NaN where nothing was recorded
  float value_min = NAN, value_max = NAN;  // finite range of `values`
  float lo = 0, hi = 1;                    // y axis
  std::vector<Decision> decisions;         // by step
  std::vector<DecisionClass> classes;

 private:
  std::vector<std::pair<QString, int>> legend_entries(bool compact) const;
  QString fitted_title(const QFontMetricsF& fm, double width) const;
  void paint_data(QPainter& p, const QRectF& plot, int columns) const;
  void paint_legend(QPainter& p, const Layout& l) const;
};

}  // namespace kvscope::views
