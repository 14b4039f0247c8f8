#include "views/timeline_view.h"

#include <QMouseEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "views/view_descriptors.h"

namespace kvscope::views {

TimelineView::TimelineView(TimelineMode mode, CurrentState* state, TraceService* service,
                           QWidget* parent)
    : FigureWidget(mode == TimelineMode::Head ? "timeline" : "layers", state, service, parent),
      mode_(mode) {
  setMouseTracking(true);  // the tooltip follows the pointer
}

uint32_t TimelineView::reload_on() const {
  // The head raster shows every step at once: a new step or token only moves
  // a line (follow). The layers mode counts holders at the step: it reloads.
  uint32_t base = kTraceChanged | kHeadChanged | kTraceGrew;
  return mode_ == TimelineMode::Layers ? base | kStepChanged | kTokensChanged : base;
}

void TimelineView::follow(const Selection& sel) {
  TimelineFigure* f = timeline();
  if (!f || mode_ != TimelineMode::Head) return;
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
  f->selected_token = sel.token();
  update();
}

void TimelineView::state_changed(const Selection& sel, uint32_t changes) {
  if (changes & (kStepChanged | kTokensChanged)) follow(sel);
  FigureWidget::state_changed(sel, changes);
}

void TimelineView::adopt(std::shared_ptr<Figure> previous) {
  auto* old = dynamic_cast<TimelineFigure*>(previous.get());
  if (old && timeline() && old->extent() == timeline()->extent())
    timeline()->set_viewport(old->viewport());
  // The step or token may have moved while the figure loaded (no reload for that).
  follow(state_->selection());
}

void TimelineView::zoom_at(const QPointF& point, double fx, double fy) {
  TimelineFigure* f = timeline();
  if (!f) return;
  QRectF plot = f->plot_rect(area()), v = f->viewport();
  double ax = v.left() + std::clamp((point.x() - plot.left()) / plot.width(), 0.0, 1.0) * v.width();
  double ay = v.top() + std::clamp((point.y() - plot.top()) / plot.height(), 0.0, 1.0) * v.height();
  double w = v.width() * fx, h = v.height() * fy;
  f->set_viewport(QRectF(ax - (ax - v.left()) * fx, ay - (ay - v.top()) * fy, w, h));
  update();
}

void TimelineView::pan_by(const QPointF& d) {
  TimelineFigure* f = timeline();
  if (!f) return;
  QRectF plot = f->plot_rect(area()), v = f->viewport();
  f->set_viewport(
      v.translated(-d.x() * v.width() / plot.width(), -d.y() * v.height() / plot.height()));
  update();
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  double f = std::pow(0.8, e->angleDelta().y() / 120.0);
  bool tokens_only = e->modifiers() & Qt::ControlModifier;
  if (mode_ == TimelineMode::Layers) return zoom_at(e->position(), f, 1.0);
  zoom_at(e->position(), tokens_only ? 1.0 : f, f);
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  dragging_ = true;
  moved_ = false;
  press_ = last_ = e->position();
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  if (!dragging_) {
    TimelineFigure* f = timeline();
    if (!f) return;
    const QRectF plot = f->plot_rect(area()), v = f->viewport();
    if (!plot.contains(e->position())) return QToolTip::hideText();
    const double x = v.left() + (e->position().x() - plot.left()) / plot.width() * v.width();
    const double y = v.top() + (e->position().y() - plot.top()) / plot.height() * v.height();
    QToolTip::showText(e->globalPosition().toPoint(), f->describe(x, y), this);
    return;
  }
  if ((e->position() - press_).manhattanLength() > 4) moved_ = true;
  if (moved_) pan_by(e->position() - last_);
  last_ = e->position();
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  dragging_ = false;
  TimelineFigure* f = timeline();
  if (moved_ || !f) return;
  QRectF plot = f->plot_rect(area());
  if (!plot.contains(e->position())) return;
  QRectF v = f->viewport();
  double x = v.left() + (e->position().x() - plot.left()) / plot.width() * v.width();
  double y = v.top() + (e->position().y() - plot.top()) / plot.height() * v.height();
  // The change is applied here first and announced to every other view.
  if (mode_ == TimelineMode::Head) {
    f->step = std::clamp<int64_t>(int64_t(x), 0, std::max<int64_t>(0, f->n_steps - 1));
    f->selected_token = std::clamp<int64_t>(int64_t(y), 0, std::max<int64_t>(0, f->n_tokens - 1));
    state_->set_step(f->step, this);
    state_->set_tokens({f->selected_token}, this);
  } else {
    state_->set_tokens({int64_t(x)}, this);
    state_->set_head(int(y), state_->selection().head, this);
  }
  update();
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent*) {
  if (!timeline()) return;
  timeline()->set_viewport(timeline()->extent());
  update();
}

namespace {

ViewDescriptor timeline_descriptor(TimelineMode mode) {
  ViewDescriptor d;
  d.figure = [mode](TraceData& data, TraceData*,
                    const FigureRequest& q) -> std::shared_ptr<Figure> {
    auto f = TimelineFigure::load(data, q.selection, mode);
    if (!q.viewport.isEmpty()) f->set_viewport(q.viewport);
    return f;
  };
  d.widget = [mode](CurrentState* s, TraceService* t) -> FigureWidget* {
    return new TimelineView(mode, s, t);
  };
  d.area = DockArea::Right;
  return d;
}

}  // namespace

ViewDescriptor timeline_view() {
  ViewDescriptor d = timeline_descriptor(TimelineMode::Head);
  d.name = "timeline";
  d.title = "Eviction timeline";
  d.raised = true;
  d.share = {0.34, 0.3};
  return d;
}

ViewDescriptor layers_view() {
  ViewDescriptor d = timeline_descriptor(TimelineMode::Layers);
  d.name = "layers";
  d.title = "Heads holding tokens";
  d.tab_with = "timeline";
  return d;
}

}  // namespace kvscope::views
