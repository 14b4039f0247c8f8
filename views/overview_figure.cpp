#include "views/overview_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "views/layer_marks.h"

namespace kvscope::views {

QStringList overview_metric_names() {
  return {"head index", "sink mass", "local mass", "entropy", "entries held", "lost mass (oracle)"};
}

std::shared_ptr<OverviewFigure> OverviewFigure::load(TraceData& data, const Selection& sel,
                                                     OverviewMetric metric) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<OverviewFigure>();
  f->metric = metric;
  f->layer = sel.layer;
  f->head = sel.head;
  f->layers = r.n_layers();
  f->heads = r.n_heads();
  f->windows = r.run().model.layer_window;
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, r.n_steps() - 1));
  const int64_t L = f->layers, H = f->heads, K = r.n_kv_heads();
  const int64_t group = std::max<int64_t>(1, H / std::max<int64_t>(1, K));
  f->thumbs.resize(size_t(L * H));
  f->values.assign(size_t(L * H), 0.f);
  auto lod = data.lod();
  auto partial = lod ? nullptr : data.partial_lod();
  // Per head: the metrics from the cache, or from the build so far.
  std::vector<float> metrics(size_t(L * H * analysis::kMetricCount), 0.f);
  auto thumbnail = [&](int l, int h, const analysis::AttentionGrid& g) {
    f->thumbs[size_t(l * H + h)] = colorize(g.mean, int(g.rows()), int(g.cols()),
                                            ColorScale::fit(g.mean, ColorMapId::Viridis, true));
  };
  if (lod) {
    int level = lod->level_for_side(analysis::kThumbnailSide);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        thumbnail(l, h, lod->whole(l, h, level));
        for (int m = 0; m < analysis::kMetricCount; ++m)
          metrics[size_t((l * H + h) * analysis::kMetricCount + m)] =
              lod->metric(l, h, analysis::HeadMetric(m));
      }
    f->thumbnails = true;
  } else if (partial && partial->done() > 0 && partial->layers() == L && partial->heads() == H) {
    analysis::AttentionGrid g;
    std::vector<float> m;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        if (partial->get(l, h, &g, &m)) {
          thumbnail(l, h, g);
          std::copy(m.begin(), m.end(), metrics.begin() + (l * H + h) * analysis::kMetricCount);
        }
    f->thumbnails = true;
    f->note = QString("building the level-of-detail cache: %1 of %2 heads")
                  .arg(partial->done())
                  .arg(L * H);
  } else if (r.layout().pooled_block <= 0) {
    f->note = "no pooled attention: thumbnails need capture level 'pooled'";
  } else if (!r.complete()) {
    f->note = "trace still being written: thumbnails appear once it is complete";
  } else {
    f->note = "building the level-of-detail cache…";
  }
  std::vector<int32_t> occ;
  std::vector<float> lost;
  if (metric == OverviewMetric::Occupancy && r.n_steps() > 0) occ = r.occupancy(f->step);
  if (metric == OverviewMetric::LostMass && r.layout().oracle && r.n_steps() > 0)
    lost = r.oracle_lost_mass(f->step);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      float v = 0;
      switch (metric) {
        case OverviewMetric::Head: v = -float(h); break;
        case OverviewMetric::SinkMass:
        case OverviewMetric::LocalMass:
        case OverviewMetric::Entropy: {
          const int m = int(metric) - int(OverviewMetric::SinkMass);
          v = metrics[size_t((l * H + h) * analysis::kMetricCount + m)];
          break;
        }
        case OverviewMetric::Occupancy: {
          int64_t k = h / group, R = r.n_tiers();
          for (int64_t t = 0; t < R && !occ.empty(); ++t)
            v += float(occ[size_t((l * K + k) * R + t)]);
          break;
        }
        case OverviewMetric::LostMass: v = lost.empty() ? 0 : lost[size_t(l * H + h)]; break;
      }
      f->values[size_t(l * H + h)] = v;
    }
  f->order.resize(size_t(L));
  for (int l = 0; l < L; ++l) {
    std::vector<int>& o = f->order[size_t(l)];
    o.resize(size_t(H));
    std::iota(o.begin(), o.end(), 0);
    std::stable_sort(o.begin(), o.end(), [&](int a, int b) {
      return f->values[size_t(l * H + a)] > f->values[size_t(l * H + b)];
    });
  }
  return f;
}

QString OverviewFigure::title() const {
  return QString("Layers x heads · sorted by %1").arg(overview_metric_names()[int(metric)]);
}

// Square cells (a thumbnail is a square attention map: never a sliver),
// as large as the room allows, the grid left-aligned under the title.
QRectF OverviewFigure::grid(const QRectF& area) const {
  bool bar = metric != OverviewMetric::Head;
  // Bottom: the axis label and, under it, the sliding-window caption.
  QRectF room =
      area.adjusted(44, 52, bar ? -84 : -8, window_layers_caption(windows).isEmpty() ? -30 : -44);
  double side = std::min(room.width() / std::max<int64_t>(1, heads),
                         room.height() / std::max<int64_t>(1, layers));
  side = std::max(1.0, side);
  return QRectF(room.left(), room.top(), side * double(heads), side * double(layers));
}

QRectF OverviewFigure::cell(const QRectF& g, int l, int column) const {
  double cw = g.width() / std::max<int64_t>(1, heads),
         ch = g.height() / std::max<int64_t>(1, layers);
  return QRectF(g.left() + column * cw, g.top() + l * ch, cw, ch);
}

int OverviewFigure::column_of(int l, int h) const {
  const auto& o = order[size_t(l)];
  return int(std::find(o.begin(), o.end(), h) - o.begin());
}

std::pair<int, int> OverviewFigure::head_at(const QRectF& area, const QPointF& pt) const {
  QRectF plot = grid(area);
  if (!plot.contains(pt) || layers == 0 || heads == 0) return {-1, -1};
  int l = int((pt.y() - plot.top()) / plot.height() * layers);
  int c = int((pt.x() - plot.left()) / plot.width() * heads);
  l = std::clamp<int>(l, 0, int(layers) - 1);
  c = std::clamp<int>(c, 0, int(heads) - 1);
  return {l, order[size_t(l)][size_t(c)]};
}

void OverviewFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(), note);
  QRectF plot = grid(area);
  float vmax = -INFINITY, vmin = INFINITY;
  for (float v : values) vmax = std::max(vmax, v), vmin = std::min(vmin, v);
  ColorScale cs;
  cs.lo = vmin;
  cs.hi = vmax > vmin ? vmax : vmin + 1;
  p.save();
  p.setFont(plot::font(6.5));
  QFontMetricsF small(p.font());
  for (int l = 0; l < layers; ++l) {
    for (int c = 0; c < heads; ++c) {
      int h = order[size_t(l)][size_t(c)];
      QRectF r = cell(plot, l, c).adjusted(1, 1, -1, -1);
      const QImage& img = thumbs[size_t(l * heads + h)];
      if (!img.isNull()) {
        p.setRenderHint(QPainter::SmoothPixmapTransform, false);
        p.drawImage(r, img);
      } else {
        // No thumbnail: the metric itself as the cell colour.
        p.fillRect(r, metric == OverviewMetric::Head
                          ? QColor(235, 235, 235)
                          : QColor(cs.color(values[size_t(l * heads + h)])));
      }
      // Sorted rows name their heads inside the cells where they fit.
      if (metric != OverviewMetric::Head && r.width() >= 18 && r.height() >= small.height() + 2) {
        p.setPen(Qt::white);
        p.drawText(r.adjusted(2, 1, -1, -1), Qt::AlignLeft | Qt::AlignTop, QString::number(h));
      }
    }
  }
  for (int l = 0; l < layers; ++l)
    if (is_window_row(windows, l)) {
      const QRectF row = cell(plot, l, 0);
      paint_window_bar(p, plot.right(), row.top() + 1, row.bottom() - 1);
    }
  if (layer < layers && head < heads) {
    p.setPen(QPen(palette::kVermillion, 2.5));
    p.setBrush(Qt::NoBrush);
    p.drawRect(cell(plot, layer, column_of(layer, head)));
  }
  p.restore();
  paint_axes(p, plot);
  if (metric != OverviewMetric::Head)
    plot::colorbar(p, QRectF(plot.right() + 10, plot.top(), 10, plot.height()), cs,
                   overview_metric_names()[int(metric)]);
}

// Layer labels left of the rows and column labels above the columns (head
// index, or rank when sorted), thinned to one every k rows/columns so they
// never touch.
void OverviewFigure::paint_axes(QPainter& p, const QRectF& plot) const {
  p.save();
  p.setFont(plot::font(8));
  p.setPen(Qt::black);
  QFontMetricsF fm(p.font());
  double ch = plot.height() / std::max<int64_t>(1, layers);
  double cw = plot.width() / std::max<int64_t>(1, heads);
  int row_every = std::max(1, int(std::ceil((fm.height() + 2) / std::max(ch, 1e-9))));
  for (int l = 0; l < layers; l += row_every) {
    QRectF row = cell(plot, l, 0);
    p.drawText(QRectF(plot.left() - 44, row.center().y() - fm.height() / 2, 40, fm.height()),
               Qt::AlignRight | Qt::AlignVCenter, QString("L%1").arg(l));
  }
  double widest = fm.horizontalAdvance(QString::number(std::max<int64_t>(0, heads - 1)));
  int col_every = std::max(1, int(std::ceil((widest + 6) / std::max(cw, 1e-9))));
  for (int c = 0; c < heads; c += col_every) {
    QRectF col = cell(plot, 0, c);
    p.drawText(QRectF(col.center().x() - 20, plot.top() - fm.height() - 2, 40, fm.height()),
               Qt::AlignHCenter | Qt::AlignBottom, QString::number(c));
  }
  QString label = metric == OverviewMetric::Head
                      ? QString("query head")
                      : "rank by " + overview_metric_names()[int(metric)] + " (number: head)";
  p.drawText(QRectF(plot.left(), plot.bottom() + 6,
                    std::max(plot.width(), fm.horizontalAdvance(label) + 4), fm.height() + 2),
             Qt::AlignLeft | Qt::AlignTop | Qt::TextDontClip, label);
  const QString caption = window_layers_caption(windows);
  if (!caption.isEmpty()) {
    // Elided to what the grid's row leaves, so a narrow window never clips it.
    const double room = std::max(plot.width(), 260.0);
    p.setPen(QColor(60, 60, 60));
    p.drawText(QRectF(plot.left(), plot.bottom() + 8 + fm.height(), room, fm.height() + 2),
               Qt::AlignLeft | Qt::AlignTop, fm.elidedText(caption, Qt::ElideRight, room));
  }
  p.restore();
}

void OverviewFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  if (!window_layers_caption(windows).isEmpty()) {
    out << "# sliding-window layers:";
    for (int l = 0; l < layers; ++l)
      if (is_window_row(windows, l)) out << ' ' << l << '(' << windows[size_t(l)] << ')';
    out << "\n";
  }
  out << "layer,head,rank," << overview_metric_names()[int(metric)].replace(' ', '_') << "\n";
  for (int l = 0; l < layers; ++l)
    for (int c = 0; c < heads; ++c) {
      int h = order[size_t(l)][size_t(c)];
      out << l << ',' << h << ',' << c << ',' << values[size_t(l * heads + h)] << '\n';
    }
}

}  // namespace kvscope::views
