// Head budgets: a layers x kv-heads grid of entries held at the current step,
// and entries over steps for the current head (stacked by tier) against the
// other heads of its layer — what a global-budget policy moves between heads.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class BudgetFigure : public Figure {
 public:
  static std::shared_ptr<BudgetFigure> load(TraceData& data, const Selection& sel);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  // Grid cell rectangle of head (layer, kv_head) inside a figure area (clicks, tests).
  QRectF grid_cell(const QRectF& area, int layer, int kv_head) const;

  int layer = 0, kv_head = 0;
  int64_t step = 0, n_steps = 0, layers = 0, kv_heads = 0, tiers = 1;
  std::vector<QString> tier_names;
  QString budget_kind;
  int64_t budget = 0;
  std::vector<int32_t> at_step;                    // L*K*R entries after the step
  std::vector<int32_t> series;                     // steps x R of the current head
  std::vector<std::vector<int32_t>> layer_series;  // per kv head of the layer: steps (all tiers)

  int64_t head_total(int l, int k) const;

 private:
  void paint_grid(QPainter& p, const QRectF& r) const;
  void paint_series(QPainter& p, const QRectF& r) const;
  QRectF series_area(QPainter& p, const QRectF& area) const;
  std::vector<std::pair<QColor, QString>> legend_items() const;
};

}  // namespace kvscope::views
