// The token-history view: the selected tokens' attention and status over the
// steps.
#pragma once

#include "views/figure_widget.h"
#include "views/tokens_figure.h"

namespace kvscope::views {

class HistoryView : public FigureWidget {
  Q_OBJECT
 public:
  HistoryView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override { return FigureWidget::reload_on() | kTokensChanged; }
};

}  // namespace kvscope::views
