#include "views/causal_view.h"

#include <QMouseEvent>
#include <QToolTip>

#include "views/view_descriptors.h"

namespace kvscope::views {

CausalView::CausalView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("causal", state, service, parent) {
  setMouseTracking(true);
}

void CausalView::mouseMoveEvent(QMouseEvent* e) {
  auto* f = dynamic_cast<CausalFigure*>(figure_.get());
  int64_t layer = 0, kv_head = 0;
  if (!f || !f->cell_at(area(), e->position(), &layer, &kv_head)) return QToolTip::hideText();
  QToolTip::showText(e->globalPosition().toPoint(), f->describe(layer, kv_head), this);
}

void CausalView::mousePressEvent(QMouseEvent* e) {
  auto* f = dynamic_cast<CausalFigure*>(figure_.get());
  int64_t layer = 0, kv_head = 0;
  if (e->button() != Qt::LeftButton || !f || !f->cell_at(area(), e->position(), &layer, &kv_head))
    return;
  const std::string trace = f->trace_of(layer, kv_head);
  if (!trace.empty()) state_->set_compare(trace, this);
}

ViewDescriptor causal_view() {
  ViewDescriptor d;
  d.name = "causal";
  d.title = "Causal";
  d.figure = [](TraceData& data, TraceData*, const FigureRequest&) -> std::shared_ptr<Figure> {
    return CausalFigure::load(data);
  };
  d.widget = make_view<CausalView>;
  d.area = DockArea::Bottom;
  d.tab_with = "needle";
  return d;
}

}  // namespace kvscope::views
