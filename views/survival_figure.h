// Survival curves (seed 002, fig. 2): for the current kv head, the fraction
// of tokens still held by the policy and still receiving attention at
// horizon h, beside the other heads of its layer; and a layers x kv-heads map
// of "held at horizon h" (fig. 2b) showing which heads keep long-range tokens.
#pragma once

#include <memory>
#include <vector>

#include "core/analysis/survival.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class SurvivalFigure : public Figure {
 public:
  static std::shared_ptr<SurvivalFigure> load(TraceData& data, const Selection& sel,
                                              int64_t horizon = -1);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  int layer = 0, kv_head = 0;
  int64_t horizon = 0, layers = 0, kv_heads = 0;
  QString criterion;
  analysis::SurvivalCurve curve;                // the current head
  std::vector<std::vector<double>> layer_held;  // held curves of the layer's heads
  std::vector<double> held_at_horizon;          // L*K

  // Drawing helpers reused by the compare figure.
  static void paint_curves(QPainter& p, const QRectF& plot,
                           const std::vector<std::pair<const std::vector<double>*, QPen>>& curves,
                           int64_t max_h, int64_t mark_h);
};

}  // namespace kvscope::views
