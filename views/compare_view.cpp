#include "views/compare_view.h"

#include <QPainter>

#include "core/common/input_error.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

CompareView::CompareView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("compare", state, service, parent) {}

void CompareView::state_changed(const Selection& sel, uint32_t changes) {
  if (sel.compare.empty()) {
    figure_.reset();
    update();
    return;
  }
  FigureWidget::state_changed(sel, changes);
}

void CompareView::paintEvent(QPaintEvent* e) {
  if (state_->selection().compare.empty()) {
    QPainter p(this);
    p.fillRect(rect(), Qt::white);
    plot::message(p, area(),
                  "Compare: open a second trace of the same prompt and choose it in the toolbar's "
                  "“compare with” box");
    return;
  }
  FigureWidget::paintEvent(e);
}

ViewDescriptor compare_view() {
  ViewDescriptor d;
  d.name = "compare";
  d.title = "Compare";
  d.figure = [](TraceData& data, TraceData* compare,
                const FigureRequest& q) -> std::shared_ptr<Figure> {
    if (!compare)
      throw InputError(data.reader().path(), "--compare", "the compare view needs a second trace");
    return CompareFigure::load(data, *compare, q.selection);
  };
  d.widget = make_view<CompareView>;
  d.area = DockArea::Bottom;
  d.tab_with = "history";
  return d;
}

}  // namespace kvscope::views
