#include "views/needle_view.h"

#include <algorithm>

#include "views/view_descriptors.h"

namespace kvscope::views {

NeedleView::NeedleView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("needle", state, service, parent) {}

void NeedleView::state_changed(const Selection& sel, uint32_t changes) {
  FigureWidget::state_changed(sel, changes);
  auto* f = dynamic_cast<NeedleFigure*>(figure_.get());
  if (f && (changes & (kStepChanged | kHeadChanged))) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    f->layer = sel.layer;
    f->kv_head = sel.kv_head();
    update();
  }
}

ViewDescriptor needle_view() {
  ViewDescriptor d;
  d.name = "needle";
  d.title = "Needle";
  d.figure = [](TraceData& data, TraceData* compare,
                const FigureRequest& q) -> std::shared_ptr<Figure> {
    return NeedleFigure::load(data, compare, q.selection);
  };
  d.widget = make_view<NeedleView>;
  d.area = DockArea::Bottom;
  d.tab_with = "history";
  return d;
}

}  // namespace kvscope::views
