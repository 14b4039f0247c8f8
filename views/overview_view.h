// The layers × heads overview: a click selects a head; heads sort by the
// chosen metric.
#pragma once

#include "views/figure_widget.h"
#include "views/overview_figure.h"

namespace kvscope::views {

class OverviewView : public FigureWidget {
  Q_OBJECT
 public:
  OverviewView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  OverviewFigure* overview() const { return static_cast<OverviewFigure*>(figure_.get()); }
  void set_metric(OverviewMetric metric);
  // Selects the head under a widget point, as a click does.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override;
  void state_changed(const Selection& selection, uint32_t changes) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
};

}  // namespace kvscope::views
