// Forecast vs realised attention for one token at one (layer, kv head): a
// time-varying gate's samples over steps (for the SFC, sfc_forecast) as a
// step line — a sample holds until the next — above the attention the token
// received per step (/attention/received; the figure says so when the trace
// has none), over background bands of the tier the token was in (a tier the
// attention does not read hatched), with its promotions (by reason) and
// stalls as marks in a lane above, and the gate's threshold as a dashed line.
// Generic: any time-varying gate of the trace, the first by default. More
// samples or steps than pixel columns fold to one min-max segment per column.
#pragma once

#include <QPolygonF>
#include <cmath>
#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/tier_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

class ForecastFigure : public Figure {
 public:
  // The token's residence at the head: [begin, end) in `tier`; -1 evicted.
  struct Band {
    int32_t begin = 0, end = 0;
    int tier = 0;
  };
  struct Mark {
    int32_t step = 0;
    uint8_t cls = 0;  // index into mark_kinds
  };
  struct Layout {
    QRectF title, legend, lane, gate_plot, received_plot;
    bool compact = false;
  };

  // `gate`: index into the trace's gates; -1 the first time-varying one.
  static std::shared_ptr<ForecastFigure> load(TraceData& data, const Selection& sel, int gate = -1);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  // `device`: where the text is drawn (its DPI sizes the legend); null: the screen.
  Layout layout(const QRectF& area, const QPaintDevice* device = nullptr) const;
  plot::Map x_map(const QRectF& plot) const;  // steps, each a unit cell centred on its index
  // The gate's step line and the received attention as drawn in `plot` with
  // `columns` pixel columns: exact below one sample (step) per column, else a
  // min-max segment per column. Runs break where there is no value.
  std::vector<QPolygonF> gate_line(const QRectF& plot, int columns) const;
  std::vector<QPolygonF> received_line(const QRectF& plot, int columns) const;
  // The step under `point` in the figure's plots (-1: outside them).
  int64_t step_at(const QRectF& area, const QPointF& point) const;

  int layer = 0, kv_head = 0;
  int64_t token = -1, step = 0, n_steps = 0, fed_step = 0;
  QString token_text;
  int gate = -1;                  // index into the trace's gates (-1: none to show)
  std::vector<int> gate_choices;  // the trace's time-varying gates
  QStringList gate_choice_names;
  QString gate_name, gate_meaning, gate_units;
  double threshold = NAN;
  std::vector<std::pair<int32_t, float>> samples;  // (step, value) of the token, by step
  bool has_received = false;                       // the trace captured /attention/received
  std::vector<float> received;  // per step; NaN: not in the step's row (not attended, not fed)
  std::vector<QString> tier_names;
  std::vector<uint8_t> tier_attended;
  std::vector<Band> bands;
  std::vector<trace::Event> promotions;  // of the token at the head, by step
  std::vector<trace::StallRow> stalls;   // of the token at the head, by step
  std::vector<MarkClass> mark_kinds;     // promotion reasons, then stalls
  std::vector<Mark> marks;               // by step
  float gate_lo = 0, gate_hi = 1, received_hi = 1;

 private:
  std::vector<LegendEntry> legend_entries(bool compact) const;
  void paint_bands(QPainter& p, const QRectF& plot) const;
  void paint_lane(QPainter& p, const Layout& l) const;
  QString fitted_title(const QFontMetricsF& fm, double width) const;
};

}  // namespace kvscope::views
