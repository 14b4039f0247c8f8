// The token-text view: hover shows each token's per-head status, a click
// selects it (Ctrl extends), the wheel scrolls; a selection made elsewhere
// scrolls to it.
#pragma once

#include "views/figure_widget.h"
#include "views/tokens_figure.h"

namespace kvscope::views {

class TokensView : public FigureWidget {
  Q_OBJECT
 public:
  TokensView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  TokensFigure* tokens() const { return static_cast<TokensFigure*>(figure_.get()); }
  void set_coloring(TokenColoring coloring);
  void scroll_to_token(int64_t token);

 protected:
  void state_changed(const Selection& selection, uint32_t changes) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void wheelEvent(QWheelEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
};

}  // namespace kvscope::views
