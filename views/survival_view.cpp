#include "views/survival_view.h"

#include <QSpinBox>
#include <climits>

#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

SurvivalView::SurvivalView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("survival", state, service, parent) {}

void SurvivalView::set_horizon(int64_t h) {
  set_option("horizon", std::to_string(h));
}

namespace {

QWidget* survival_controls(FigureWidget* widget) {
  auto* view = static_cast<SurvivalView*>(widget);
  QHBoxLayout* l;
  QWidget* w = controls_row(&l);
  auto* h = new QSpinBox;
  h->setRange(-1, 1 << 24);
  h->setValue(-1);
  h->setSpecialValueText("auto");
  QObject::connect(h, qOverload<int>(&QSpinBox::valueChanged), view,
                   [view](int v) { view->set_horizon(v); });
  l->addWidget(new QLabel("horizon h for the per-head map"));
  l->addWidget(h);
  l->addStretch();
  return w;
}

}  // namespace

ViewDescriptor survival_view() {
  ViewDescriptor d;
  d.name = "survival";
  d.title = "Survival";
  d.options = {{"horizon",
                "survival: horizon h for the per-head map (default: automatic)",
                {},
                false,
                1,
                INT32_MAX}};
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return SurvivalFigure::load(data, q.selection, option_int(q.options, "horizon", -1));
  };
  d.widget = make_view<SurvivalView>;
  d.controls = survival_controls;
  d.area = DockArea::Right;
  d.tab_with = "budget";
  return d;
}

}  // namespace kvscope::views
