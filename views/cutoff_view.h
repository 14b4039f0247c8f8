// The eviction-cutoff view: follows the head; a new step or token selection
// only moves the step line and the highlight (the figure's data does not
// depend on them).
#pragma once

#include "views/cutoff_figure.h"
#include "views/figure_widget.h"

namespace kvscope::views {

class CutoffView : public FigureWidget {
  Q_OBJECT
 public:
  CutoffView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  CutoffFigure* cutoff() const { return static_cast<CutoffFigure*>(figure_.get()); }
  void set_series(int series);
  // A click on a decision selects its token and step; elsewhere, the step.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kHeadChanged | kTraceGrew; }
  void state_changed(const Selection& selection, uint32_t changes) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  void follow(const Selection& sel);
};

}  // namespace kvscope::views
