#include "views/heatmap_view.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <cmath>

namespace kvscope::views {

HeatmapView::HeatmapView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("heatmap", state, service, parent) {
  setMouseTracking(true);
  setFocusPolicy(Qt::ClickFocus);
}

QSizeF HeatmapView::plot_pixels() const {
  return HeatmapFigure::plot_rect(area()).size() * devicePixelRatioF();
}

std::function<std::shared_ptr<Figure>(TraceData&)> HeatmapView::loader(const Selection& sel) {
  HeatmapOptions o = options_;
  QSizeF px = plot_pixels();
  HeatmapFigure* f = heatmap();
  if (f && sel.trace == f->trace && f->layer == sel.layer && f->head == sel.head &&
      f->n_tokens == sel.n_tokens && f->options().prefer_dense == o.prefer_dense &&
      f->options().coarse_cells == o.coarse_cells) {
    // Only the step moved (scrubbing, playing): keep the grids, re-read the
    // eviction state. The copy is made here, on the GUI thread that paints f.
    auto copy = std::make_shared<HeatmapFigure>(*f);
    return [copy, sel](TraceData& data) -> std::shared_ptr<Figure> {
      return copy->at_step(data, sel.step);
    };
  }
  return [sel, o, px](TraceData& data) -> std::shared_ptr<Figure> {
    return HeatmapFigure::load(data, sel, o, px);
  };
}

void HeatmapView::adopt(std::shared_ptr<Figure> previous) {
  // Keep the user's zoom across steps and heads of the same trace.
  auto* old = dynamic_cast<HeatmapFigure*>(previous.get());
  if (old && heatmap() && old->extent() == heatmap()->extent() &&
      old->viewport() != old->extent()) {
    heatmap()->set_viewport(old->viewport());
    viewport_changed();
  }
}

void HeatmapView::state_changed(const Selection& selection, uint32_t changes) {
  FigureWidget::state_changed(selection, changes);
  if ((changes & kTokensChanged) && heatmap()) {
    heatmap()->selected = selection.tokens;
    update();
  }
}

void HeatmapView::set_options(const HeatmapOptions& o) {
  options_ = o;
  if (heatmap()) heatmap()->set_options(o);
  update();
}

void HeatmapView::viewport_changed() {
  update();
  HeatmapFigure* f = heatmap();
  if (!f || !f->wants_detail(plot_pixels())) return;
  ++detail_requests_;
  int layer = f->layer, head = f->head;
  int64_t block = f->block;
  int dense = f->dense_index;
  QRectF v = f->viewport();
  QSizeF px = plot_pixels();
  std::weak_ptr<Figure> target = figure_;
  HeatmapOptions o = f->options();
  ColorScale scale = f->scale();
  using Detail = std::pair<analysis::AttentionGrid, QImage>;
  service_->request<Detail>(
      state_->selection().trace, "heatmap-detail",
      [=](TraceData& data) {
        // Read and colour on the worker: the GUI thread only blits.
        analysis::AttentionGrid g =
            HeatmapFigure::load_detail(data, layer, head, v, px, block, dense);
        QImage img = HeatmapFigure::colorize_grid(g, o, scale);
        return Detail(std::move(g), std::move(img));
      },
      [this, target, scale](Detail d) {
        auto fig = target.lock();
        if (!fig || fig != figure_) return;  // the figure was replaced meanwhile
        bool same_scale = heatmap()->scale().lo == scale.lo && heatmap()->scale().hi == scale.hi &&
                          heatmap()->scale().map == scale.map &&
                          heatmap()->scale().log == scale.log;
        heatmap()->set_detail(std::move(d.first), same_scale ? std::move(d.second) : QImage());
        update();
      },
      this);
}

void HeatmapView::zoom_at(const QPointF& point, double factor) {
  HeatmapFigure* f = heatmap();
  if (!f) return;
  QRectF plot = f->zoomed_plot_rect(area());
  QRectF v = f->viewport();
  double fx = std::clamp((point.x() - plot.left()) / plot.width(), 0.0, 1.0);
  double fy = std::clamp((point.y() - plot.top()) / plot.height(), 0.0, 1.0);
  double ax = v.left() + fx * v.width(), ay = v.top() + fy * v.height();
  double w = v.width() * factor, h = v.height() * factor;
  f->set_viewport(QRectF(ax - fx * w, ay - fy * h, w, h));
  viewport_changed();
}

void HeatmapView::pan_by(const QPointF& d) {
  HeatmapFigure* f = heatmap();
  if (!f) return;
  QRectF plot = f->zoomed_plot_rect(area());
  QRectF v = f->viewport();
  f->set_viewport(
      v.translated(-d.x() * v.width() / plot.width(), -d.y() * v.height() / plot.height()));
  viewport_changed();
}

void HeatmapView::reset_view() {
  if (!heatmap()) return;
  heatmap()->set_viewport(heatmap()->extent());
  viewport_changed();
}

void HeatmapView::wheelEvent(QWheelEvent* e) {
  zoom_at(e->position(), std::pow(0.8, e->angleDelta().y() / 120.0));
}

void HeatmapView::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  dragging_ = true;
  drag_from_ = e->position();
}

void HeatmapView::mouseMoveEvent(QMouseEvent* e) {
  if (dragging_) {
    pan_by(e->position() - drag_from_);
    drag_from_ = e->position();
    return;
  }
  HeatmapFigure* f = heatmap();
  if (!f) return;
  QRectF plot = f->zoomed_plot_rect(area());
  if (!plot.contains(e->position())) return;
  QRectF v = f->viewport();
  double key = v.left() + (e->position().x() - plot.left()) / plot.width() * v.width();
  double query = v.top() + (e->position().y() - plot.top()) / plot.height() * v.height();
  int64_t k = int64_t(key), q = int64_t(query);
  auto text = [&](int64_t t) {
    return f->token_text && t >= 0 && t < int64_t(f->token_text->size())
               ? (*f->token_text)[size_t(t)]
               : QString();
  };
  QToolTip::showText(
      e->globalPosition().toPoint(),
      QString("query %1 \"%2\"\nkey %3 \"%4\" (%5 at step %6)\nattention %7")
          .arg(q)
          .arg(text(q))
          .arg(k)
          .arg(text(k))
          .arg(k >= 0 && k < int64_t(f->key_held.size()) && f->key_held[size_t(k)] ? "held"
                                                                                   : "not held")
          .arg(f->step)
          .arg(double(f->value_at(key, query)), 0, 'g', 3),
      this);
}

void HeatmapView::mouseReleaseEvent(QMouseEvent*) {
  dragging_ = false;
}

void HeatmapView::mouseDoubleClickEvent(QMouseEvent*) {
  reset_view();
}

void HeatmapView::keyPressEvent(QKeyEvent* e) {
  QPointF c = HeatmapFigure::plot_rect(area()).center();
  if (e->key() == Qt::Key_Plus || e->key() == Qt::Key_Equal) return zoom_at(c, 0.8);
  if (e->key() == Qt::Key_Minus) return zoom_at(c, 1.25);
  if (e->key() == Qt::Key_0) return reset_view();
  FigureWidget::keyPressEvent(e);
}

}  // namespace kvscope::views
