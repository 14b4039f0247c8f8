// The gate-score view: follows the selected tokens too.
#pragma once

#include "views/figure_widget.h"
#include "views/gates_figure.h"

namespace kvscope::views {

class GatesView : public FigureWidget {
  Q_OBJECT
 public:
  GatesView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  GatesFigure* gates() const { return static_cast<GatesFigure*>(figure_.get()); }
  // An index into the trace's gates.
  void set_gate(int gate);

 protected:
  uint32_t reload_on() const override { return FigureWidget::reload_on() | kTokensChanged; }
};

}  // namespace kvscope::views
