#include "views/overview_view.h"

#include <QComboBox>
#include <QMouseEvent>
#include <algorithm>

#include "core/common/check.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

namespace {

// --metric values: the overview's metric names with '-' for ' ', the first
// word of "head index" and "lost mass (oracle)", in OverviewMetric's order.
std::vector<std::string> metric_options() {
  std::vector<std::string> out;
  for (QString name : overview_metric_names()) {
    name = name.section(" (", 0, 0);
    if (name == "head index") name = "head";
    out.push_back(name.replace(' ', '-').toStdString());
  }
  return out;
}

OverviewMetric metric_of(const ViewOptions& options) {
  const std::vector<std::string> names = metric_options();
  const std::string name = option_text(options, "metric", names.front());
  const auto it = std::find(names.begin(), names.end(), name);
  KVSCOPE_CHECK(it != names.end(), "overview: metric '" + name + "'");
  return OverviewMetric(it - names.begin());
}

}  // namespace

OverviewView::OverviewView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("overview", state, service, parent) {}

uint32_t OverviewView::reload_on() const {
  const uint32_t base = kTraceChanged | kTraceGrew;
  const OverviewMetric m = metric_of(view_options());
  const bool per_step = m == OverviewMetric::Occupancy || m == OverviewMetric::LostMass;
  return per_step ? base | kStepChanged : base;
}

void OverviewView::state_changed(const Selection& sel, uint32_t changes) {
  if ((changes & kHeadChanged) && overview()) {  // just move the highlight
    overview()->layer = sel.layer;
    overview()->head = sel.head;
    update();
  }
  FigureWidget::state_changed(sel, changes);
}

void OverviewView::set_metric(OverviewMetric m) {
  set_option("metric", metric_options()[size_t(m)]);
}

void OverviewView::click_at(const QPointF& point) {
  OverviewFigure* f = overview();
  if (!f) return;
  auto [l, h] = f->head_at(area(), point);
  if (l < 0) return;
  f->layer = l;
  f->head = h;
  update();
  state_->set_head(l, h, this);
}

void OverviewView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

namespace {

QWidget* overview_controls(FigureWidget* widget) {
  auto* view = static_cast<OverviewView*>(widget);
  QHBoxLayout* l;
  QWidget* w = controls_row(&l);
  auto* metric = new QComboBox;
  metric->setObjectName("overviewMetric");
  metric->addItems(overview_metric_names());
  QObject::connect(metric, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_metric(OverviewMetric(i)); });
  l->addWidget(new QLabel("sort heads by"));
  l->addWidget(metric);
  l->addStretch();
  return w;
}

}  // namespace

ViewDescriptor overview_view() {
  ViewDescriptor d;
  d.name = "overview";
  d.title = "Layers × heads";
  d.options = {{"metric", "overview: sort heads by this metric", metric_options()}};
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return OverviewFigure::load(data, q.selection, metric_of(q.options));
  };
  d.widget = make_view<OverviewView>;
  d.controls = overview_controls;
  d.area = DockArea::Left;
  d.raised = true;
  d.share = {0.22, 0};
  d.reads_lod = true;
  return d;
}

}  // namespace kvscope::views
