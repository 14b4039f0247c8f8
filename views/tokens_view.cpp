#include "views/tokens_view.h"

#include <QComboBox>
#include <QMouseEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>

#include "core/common/check.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

namespace {

// --coloring's values, in TokenColoring's order.
const std::vector<std::string> kColorings = {"all", "layer", "head", "score"};

}  // namespace

TokensView::TokensView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("tokens", state, service, parent) {
  setMouseTracking(true);
}

void TokensView::set_coloring(TokenColoring c) {
  set_option("coloring", kColorings[size_t(c)]);
}

void TokensView::state_changed(const Selection& sel, uint32_t changes) {
  // A selection made elsewhere only moves the highlight: no reload.
  if ((changes & kTokensChanged) && tokens()) {
    tokens()->selected = sel.tokens;
    if (!sel.tokens.empty()) scroll_to_token(sel.tokens.front());
    update();
  }
  FigureWidget::state_changed(sel, changes);
}

void TokensView::adopt(std::shared_ptr<Figure> previous) {
  auto* old = dynamic_cast<TokensFigure*>(previous.get());
  if (!tokens()) return;
  if (old) {
    tokens()->scroll = old->scroll;
  } else if (!state_->selection().tokens.empty()) {
    // Tokens selected before the first figure arrived (Go to needle as a
    // trace opens): show them.
    scroll_to_token(state_->selection().tokens.front());
  }
}

void TokensView::scroll_to_token(int64_t token) {
  TokensFigure* f = tokens();
  if (!f || token < 0) return;
  double h = f->content_height(width());
  // Binary search is inside token_at; here a coarse estimate by proportion
  // is refined by scanning the layout through token_at from the top.
  double visible = f->body(area()).height();
  double y = h * double(token) / double(std::max<size_t>(1, f->text.size()));
  if (y < f->scroll || y > f->scroll + visible) f->scroll = std::max(0.0, y - visible / 2);
  update();
}

void TokensView::wheelEvent(QWheelEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  double max_scroll = std::max(0.0, f->content_height(width()) - f->body(area()).height());
  f->scroll = std::clamp(f->scroll - e->angleDelta().y() / 120.0 * 54, 0.0, max_scroll);
  update();
}

void TokensView::mouseMoveEvent(QMouseEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  int64_t t = f->token_at(area(), e->position());
  if (t >= 0) QToolTip::showText(e->globalPosition().toPoint(), f->tooltip(t), this);
}

void TokensView::mouseReleaseEvent(QMouseEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  int64_t t = f->token_at(area(), e->position());
  if (t < 0) return;
  std::vector<int64_t> sel = {t};
  if (e->modifiers() & Qt::ControlModifier) {  // extend the selection
    sel = f->selected;
    sel.push_back(t);
  }
  f->selected = sel;
  std::sort(f->selected.begin(), f->selected.end());
  update();
  state_->set_tokens(sel, this);
}

namespace {

QWidget* tokens_controls(FigureWidget* widget) {
  auto* view = static_cast<TokensView*>(widget);
  QHBoxLayout* l;
  QWidget* w = controls_row(&l);
  auto* c = new QComboBox;
  c->addItems({"heads holding (all layers)", "heads holding (layer)", "held by current head",
               "gate score"});
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_coloring(TokenColoring(i)); });
  l->addWidget(new QLabel("colour by"));
  l->addWidget(c);
  l->addStretch();
  l->addWidget(controls_hint("hover: per-head status · click: select"));
  return w;
}

TokenColoring coloring_of(const ViewOptions& options) {
  const std::string name = option_text(options, "coloring", "all");
  const auto it = std::find(kColorings.begin(), kColorings.end(), name);
  KVSCOPE_CHECK(it != kColorings.end(), "tokens view: coloring '" + name + "'");
  return TokenColoring(it - kColorings.begin());
}

}  // namespace

ViewDescriptor tokens_view() {
  ViewDescriptor d;
  d.name = "tokens";
  d.title = "Token text";
  d.options = {{"coloring",
                "tokens: colour by heads holding (all layers, the layer), the head, "
                "or the gate score",
                kColorings}};
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return TokensFigure::load(data, q.selection, coloring_of(q.options));
  };
  d.widget = make_view<TokensView>;
  d.controls = tokens_controls;
  d.area = DockArea::Bottom;
  d.raised = true;
  d.share = {0.5, 0.3};
  return d;
}

}  // namespace kvscope::views
