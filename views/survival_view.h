// The survival view: follows the trace and the head (not the step).
#pragma once

#include "views/figure_widget.h"
#include "views/survival_figure.h"

namespace kvscope::views {

class SurvivalView : public FigureWidget {
  Q_OBJECT
 public:
  SurvivalView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  // The horizon of the per-head map (-1: automatic).
  void set_horizon(int64_t h);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kHeadChanged | kTraceGrew; }
};

}  // namespace kvscope::views
