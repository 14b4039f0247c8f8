#include "views/heatmap_view.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QToolTip>
#include <QWheelEvent>
#include <cmath>

#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

HeatmapView::HeatmapView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("heatmap", state, service, parent) {
  setMouseTracking(true);
  setFocusPolicy(Qt::ClickFocus);
  options_ = heatmap_view_options(heatmap_options_);
}

QSizeF HeatmapView::plot_pixels() const {
  return HeatmapFigure::plot_rect(area()).size() * devicePixelRatioF();
}

std::function<std::shared_ptr<Figure>(TraceData&)> HeatmapView::loader(const Selection& sel) {
  HeatmapOptions o = heatmap_options_;
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
  FigureRequest q = request(sel);
  q.pixels = px;
  return [q](TraceData& data) -> std::shared_ptr<Figure> {
    return find_view("heatmap")->figure(data, nullptr, q);
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
  heatmap_options_ = o;
  options_ = heatmap_view_options(o);
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

ViewOptions heatmap_view_options(const HeatmapOptions& o) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  return {{"colormap", color_map_name(o.map).toStdString()},
          {"linear", flag(!o.log)},
          {"max", flag(o.use_max)},
          {"no_evicted", flag(!o.show_evicted)},
          {"auto_range", flag(o.auto_range)},
          {"lo", option_number(o.lo)},
          {"hi", option_number(o.hi)},
          {"dense", flag(o.prefer_dense)},
          {"coarse_cells", option_number(o.coarse_cells)}};
}

HeatmapOptions heatmap_options(const ViewOptions& v) {
  HeatmapOptions o;
  o.map = color_map_from_name(QString::fromStdString(option_text(v, "colormap", "viridis")));
  o.log = !option_set(v, "linear");
  o.use_max = option_set(v, "max");
  o.show_evicted = !option_set(v, "no_evicted");
  o.auto_range = option_text(v, "auto_range", "true") == "true";
  o.lo = float(option_double(v, "lo", o.lo));
  o.hi = float(option_double(v, "hi", o.hi));
  o.prefer_dense = option_text(v, "dense", "true") == "true";
  o.coarse_cells = option_double(v, "coarse_cells", o.coarse_cells);
  return o;
}

namespace {

QWidget* heatmap_controls(FigureWidget* widget) {
  auto* view = static_cast<HeatmapView*>(widget);
  QHBoxLayout* l;
  QWidget* w = controls_row(&l);
  auto* map = new QComboBox;
  map->addItems(color_map_names());
  auto* log = new QCheckBox("log");
  log->setChecked(true);
  auto* max = new QCheckBox("max");
  max->setToolTip("pooled max instead of mean");
  auto* evicted = new QCheckBox("mark evicted keys");
  evicted->setChecked(true);
  auto* dense = new QCheckBox("dense rows");
  dense->setChecked(true);
  dense->setToolTip("token-resolution rows for heads captured at level 'dense'");
  auto* autorange = new QCheckBox("auto range");
  autorange->setChecked(true);
  auto* lo = new QDoubleSpinBox;
  auto* hi = new QDoubleSpinBox;
  for (QDoubleSpinBox* s : {lo, hi}) {
    s->setDecimals(5);
    s->setRange(0, 1);
    s->setSingleStep(0.01);
    s->setEnabled(false);
  }
  lo->setValue(0.0001);
  hi->setValue(1.0);
  auto apply = [=] {
    HeatmapOptions o = view->options();
    o.map = color_map_from_name(map->currentText());
    o.log = log->isChecked();
    o.use_max = max->isChecked();
    o.show_evicted = evicted->isChecked();
    o.auto_range = autorange->isChecked();
    o.prefer_dense = dense->isChecked();
    o.lo = float(lo->value());
    o.hi = float(hi->value());
    lo->setEnabled(!o.auto_range);
    hi->setEnabled(!o.auto_range);
    view->set_options(o);
  };
  QObject::connect(map, &QComboBox::currentTextChanged, view, apply);
  for (QCheckBox* c : {log, max, evicted, autorange})
    QObject::connect(c, &QCheckBox::toggled, view, apply);
  // The source changes what is read: reload rather than recolour.
  QObject::connect(dense, &QCheckBox::toggled, view, [=] {
    apply();
    view->reload();
  });
  for (QDoubleSpinBox* s : {lo, hi})
    QObject::connect(s, &QDoubleSpinBox::valueChanged, view, apply);
  l->addWidget(new QLabel("colours"));
  l->addWidget(map);
  for (QWidget* c : std::initializer_list<QWidget*>{log, max, evicted, dense, autorange})
    l->addWidget(c);
  l->addWidget(new QLabel("range"));
  l->addWidget(lo);
  l->addWidget(hi);
  l->addStretch();
  l->addWidget(controls_hint("wheel: zoom · drag: pan · double-click: reset"));
  return w;
}

std::shared_ptr<Figure> heatmap_figure(TraceData& data, TraceData*, const FigureRequest& q) {
  auto f = HeatmapFigure::load(data, q.selection, heatmap_options(q.options), q.pixels);
  if (!q.viewport.isEmpty()) {
    f->set_viewport(q.viewport);
    if (f->wants_detail(q.pixels))
      f->set_detail(HeatmapFigure::load_detail(data, f->layer, f->head, f->viewport(), q.pixels,
                                               f->block, f->dense_index));
  }
  return f;
}

}  // namespace

ViewDescriptor heatmap_view() {
  ViewDescriptor d;
  d.name = "heatmap";
  d.title = "Attention";
  d.options = {{"colormap", "heatmap: the colour map", {"viridis", "magma", "cividis", "grey"}},
               {"linear", "heatmap: linear colour scale (default log)", {}, true},
               {"max", "heatmap: pooled max instead of mean", {}, true},
               {"no_evicted", "heatmap: do not mark keys no longer held", {}, true}};
  d.figure = heatmap_figure;
  d.widget = make_view<HeatmapView>;
  d.controls = heatmap_controls;
  d.area = DockArea::Central;
  d.reads_lod = true;
  return d;
}

}  // namespace kvscope::views
