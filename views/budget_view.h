// The head-budget view: a click on a cell selects that head.
#pragma once

#include "views/budget_figure.h"
#include "views/figure_widget.h"

namespace kvscope::views {

class BudgetView : public FigureWidget {
  Q_OBJECT
 public:
  BudgetView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  BudgetFigure* budget() const { return static_cast<BudgetFigure*>(figure_.get()); }
  // BudgetFigure::kAutoSeries, kNoSeries, or an index into the trace's /series.
  void set_series(int series);

 protected:
  void mouseReleaseEvent(QMouseEvent* event) override;
};

}  // namespace kvscope::views
