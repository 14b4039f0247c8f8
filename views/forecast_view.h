// The forecast view: follows the head and the selected token; a new step
// only moves its line.
#pragma once

#include "views/figure_widget.h"
#include "views/forecast_figure.h"

namespace kvscope::views {

class ForecastView : public FigureWidget {
  Q_OBJECT
 public:
  ForecastView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  ForecastFigure* forecast() const { return static_cast<ForecastFigure*>(figure_.get()); }
  // An index into the trace's gates (-1: the first time-varying one).
  void set_gate(int gate);
  // A click in the plots selects that step.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override {
    return kTraceChanged | kHeadChanged | kTokensChanged | kTraceGrew;
  }
  void state_changed(const Selection& selection, uint32_t changes) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  void follow(const Selection& sel);
};

}  // namespace kvscope::views
