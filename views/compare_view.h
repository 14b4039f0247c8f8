// The compare view: the current trace against the one chosen to compare
// with; the selected tokens are its focus span.
#pragma once

#include "views/compare_figure.h"
#include "views/figure_widget.h"

namespace kvscope::views {

class CompareView : public FigureWidget {
  Q_OBJECT
 public:
  CompareView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override {
    return FigureWidget::reload_on() | kCompareChanged | kTokensChanged;
  }
  void state_changed(const Selection& selection, uint32_t changes) override;
  void paintEvent(QPaintEvent* event) override;
};

}  // namespace kvscope::views
