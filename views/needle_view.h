// The needle view: reloads when the trace or the compared trace changes (the
// mass series read every decode step); a new step or head only repaints.
#pragma once

#include "views/figure_widget.h"
#include "views/needle_figure.h"

namespace kvscope::views {

class NeedleView : public FigureWidget {
  Q_OBJECT
 public:
  NeedleView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kTraceGrew | kCompareChanged; }
  void state_changed(const Selection& selection, uint32_t changes) override;
};

}  // namespace kvscope::views
