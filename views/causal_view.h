// The causal map's widget: hover names a cell's effect; a click opens the
// replay that restored it alone as the compared trace (the compare view
// then shows the original against it).
#pragma once

#include "views/causal_figure.h"
#include "views/figure_widget.h"

namespace kvscope::views {

class CausalView : public FigureWidget {
  Q_OBJECT
 public:
  CausalView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override { return kTraceChanged; }
  void mouseMoveEvent(QMouseEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
};

}  // namespace kvscope::views
