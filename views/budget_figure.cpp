#include "views/budget_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <cmath>

#include "views/layer_marks.h"

namespace kvscope::views {

namespace {
// The series shown for a choice: an index, the first "*hot_budget*" one, or none.
int resolve_series(const std::vector<trace::SeriesSpec>& all, int choice) {
  if (choice >= 0) return choice < int(all.size()) ? choice : -1;
  if (choice == BudgetFigure::kNoSeries) return -1;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name.find("hot_budget") != std::string::npos) return int(i);
  return -1;
}
}  // namespace

std::shared_ptr<BudgetFigure> BudgetFigure::load(TraceData& data, const Selection& sel,
                                                 int series) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<BudgetFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->n_steps = r.n_steps();
  f->layers = r.n_layers();
  f->windows = r.run().model.layer_window;
  f->kv_heads = r.n_kv_heads();
  f->tiers = r.n_tiers();
  f->budget_kind = QString::fromStdString(r.run().budget_kind);
  f->budget = r.run().budget;
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
  for (const trace::SeriesSpec& s : r.series()) f->series_names << QString::fromStdString(s.name);
  if (f->n_steps == 0) return f;
  f->step = std::clamp<int64_t>(sel.step, 0, f->n_steps - 1);
  f->at_step = r.occupancy(f->step);
  f->series = r.occupancy_series(f->layer, f->kv_head, 0, f->n_steps);
  for (int k = 0; k < f->kv_heads; ++k) {
    std::vector<int32_t> s = r.occupancy_series(f->layer, k, 0, f->n_steps);
    std::vector<int32_t> total(size_t(f->n_steps), 0);
    for (int64_t i = 0; i < f->n_steps; ++i)
      for (int64_t t = 0; t < f->tiers; ++t) total[size_t(i)] += s[size_t(i * f->tiers + t)];
    f->layer_series.push_back(std::move(total));
  }
  f->shown_series = resolve_series(r.series(), series);
  if (f->shown_series >= 0) {
    const trace::SeriesSpec& spec = r.series()[size_t(f->shown_series)];
    f->series_name = QString::fromStdString(spec.name);
    f->series_units = QString::fromStdString(spec.units);
    f->series_meaning = QString::fromStdString(spec.meaning);
    for (int k = 0; k < f->kv_heads; ++k)
      f->head_series.push_back(r.series_head(f->shown_series, f->layer, k, 0, f->n_steps));
    f->series_at_step = r.series_values(f->shown_series, f->step, f->step + 1);
  }
  f->head_dim = r.run().model.head_dim;
  if (r.n_pruned_key_channels() > 0) {
    f->prunes_channels = true;
    for (const trace::KeyChannelRow& c : r.pruned_key_channels())
      if (c.layer == f->layer && c.kv_head == f->kv_head && c.step <= f->step)
        f->pruned_channels.push_back(c.channel);
    std::sort(f->pruned_channels.begin(), f->pruned_channels.end());
  }
  return f;
}

int64_t BudgetFigure::head_total(int l, int k) const {
  int64_t n = 0;
  for (int64_t t = 0; t < tiers; ++t) n += at_step[size_t((l * kv_heads + k) * tiers + t)];
  return n;
}

QString BudgetFigure::title() const {
  return QString("Head budgets · step %1 · layer %2 kv head %3").arg(step).arg(layer).arg(kv_head);
}

namespace {
constexpr double kChannelStripHeight = 34;  // its caption and a row of channel cells
}  // namespace

// The grid's y-axis label sits left of the tick labels: 72 px leaves room for
// both at any layer count.
double BudgetFigure::caption_room() const {
  return window_layers_caption(windows).isEmpty() ? 56 : 70;
}

QRectF BudgetFigure::grid_area(const QRectF& area) const {
  QRectF inner = area.adjusted(8, 36, -8, -8);
  // 56 px below: tick labels, the axis label and the caption of what it
  // shows (one line more for the sliding-window caption); then the key
  // channel strip when there is one.
  const double below = caption_room() + (prunes_channels ? kChannelStripHeight : 0);
  return QRectF(inner.left() + 72, inner.top(), inner.width() * 0.36 - 72,
                std::max(10.0, inner.height() - below));
}

QRectF BudgetFigure::channel_strip(const QRectF& area) const {
  if (!prunes_channels) return {};
  const QRectF g = grid_area(area);
  return QRectF(g.left(), g.bottom() + caption_room(), g.width(), kChannelStripHeight - 4);
}

void BudgetFigure::paint_channels(QPainter& p, const QRectF& area) const {
  const QRectF r = channel_strip(area);
  if (r.isEmpty() || head_dim <= 0) return;
  p.save();
  p.setFont(plot::font(8));
  QFontMetricsF fm(p.font());
  // The longest wording that fits the strip's width (no elided caption).
  const QString n = QString::number(pruned_channels.size()), d = QString::number(head_dim);
  const QStringList wordings =
      pruned_channels.empty()
          ? QStringList{QString("key channels of kv head %1: all %2 stored").arg(kv_head).arg(d),
                        QString("all %1 key channels stored").arg(d), QString("%1 key ch.").arg(d)}
          : QStringList{QString("key channels of kv head %1: %2 of %3 pruned (dark)")
                            .arg(kv_head)
                            .arg(n, d),
                        QString("%1 of %2 key channels pruned (dark)").arg(n, d),
                        QString("%1/%2 key channels pruned").arg(n, d),
                        QString("%1/%2 pruned").arg(n, d)};
  const double room = r.width() + 100;
  QString what = wordings.back();
  for (const QString& w : wordings)
    if (fm.horizontalAdvance(w) <= room) {
      what = w;
      break;
    }
  p.setPen(QColor(60, 60, 60));
  p.drawText(QRectF(r.center().x() - room / 2, r.top(), room, fm.height() + 2),
             Qt::AlignHCenter | Qt::AlignTop, what);
  const QRectF cells(r.left(), r.top() + fm.height() + 3, r.width(),
                     std::max(4.0, r.height() - fm.height() - 3));
  const double w = cells.width() / double(head_dim);
  size_t next = 0;
  for (int64_t c = 0; c < head_dim; ++c) {
    const bool pruned = next < pruned_channels.size() && pruned_channels[next] == c;
    if (pruned) ++next;
    p.fillRect(QRectF(cells.left() + double(c) * w, cells.top(), std::max(1.0, w - (w > 3 ? 1 : 0)),
                      cells.height()),
               pruned ? QColor(40, 40, 40) : QColor(205, 225, 240));
  }
  p.setPen(QPen(QColor(120, 120, 120), 1));
  p.setBrush(Qt::NoBrush);
  p.drawRect(cells);
  p.restore();
}

std::vector<LegendEntry> BudgetFigure::legend_entries(bool compact) const {
  std::vector<LegendEntry> out;
  auto swatch = [](QColor c) {
    return [c](QPainter& p, const QRectF& r) { p.fillRect(r.adjusted(2, 2, -2, -2), c); };
  };
  auto line = [](QPen pen) {
    return [pen](QPainter& p, const QRectF& r) {
      p.setPen(pen);
      p.drawLine(QPointF(r.left(), r.center().y()), QPointF(r.right(), r.center().y()));
    };
  };
  QString head = QString("kv head %1").arg(kv_head);
  if (shown_series >= 0) {
    out.push_back({compact ? head : series_name + ": " + head, line(QPen(Qt::black, 2.2))});
    out.push_back({compact ? QString("other heads") : series_name + ": other heads of layer",
                   line(QPen(QColor(90, 90, 90, 150), 1))});
    if (series_units.contains("entries") && tiers > 0) {
      QColor c = palette::tier(0);
      c.setAlpha(110);
      out.push_back({compact ? tier_names[0] + " entries"
                             : QString("%1 entries held by %2").arg(tier_names[0], head),
                     swatch(c)});
    }
  } else {
    for (int64_t t = 0; t < tiers; ++t) {
      QColor c = palette::tier(int(t));
      c.setAlpha(170);
      out.push_back({tier_names[size_t(t)], swatch(c)});
    }
    out.push_back({compact ? QString("other heads") : QString("other heads of layer"),
                   line(QPen(QColor(90, 90, 90), 1))});
    if (budget_kind == "head" && budget > 0)
      out.push_back({"budget", line(QPen(Qt::black, 1, Qt::DashLine))});
  }
  out.push_back({QString("step %1").arg(step), line(QPen(palette::kVermillion, 1.5))});
  return out;
}

BudgetFigure::Layout BudgetFigure::series_layout(const QRectF& area,
                                                 const QPaintDevice* device) const {
  QRectF inner = area.adjusted(8, 36, -8, -8);
  // Right of the grid's colour bar and its tick labels; 70 px more for the
  // plot's y ticks and label.
  double left = inner.left() + inner.width() * 0.36 + 52;
  QRectF right(left, inner.top(), std::max(40.0, inner.right() - left), inner.height());
  QFontMetricsF fm(plot::font(kLegendPoints), device);
  double row_h = fm.height() + 3;
  Layout l;
  int rows = legend_rows(legend_entries(false), fm, right.width());
  l.compact = rows * row_h > 0.25 * right.height();
  if (l.compact) rows = legend_rows(legend_entries(true), fm, right.width());
  l.legend = QRectF(right.left(), right.top(), right.width(), rows * row_h);
  double top = l.legend.bottom() + 10;
  // 16 px on the right: the last step's tick label is centred on the edge.
  l.plot = QRectF(right.left() + 70, top, std::max(10.0, right.width() - 70 - 16),
                  std::max(10.0, right.bottom() - top - 40));
  return l;
}

QRectF BudgetFigure::grid_cell(const QRectF& area, int l, int k) const {
  QRectF g = grid_area(area);
  double cw = g.width() / std::max<int64_t>(1, kv_heads),
         ch = g.height() / std::max<int64_t>(1, layers);
  return QRectF(g.left() + k * cw, g.top() + l * ch, cw, ch);
}

float BudgetFigure::grid_value(int l, int k) const {
  if (shown_series >= 0) return series_at_step[size_t(l * kv_heads + k)];
  return float(head_total(l, k));
}

void BudgetFigure::paint_grid(QPainter& p, const QRectF& area) const {
  QRectF g = grid_area(area);
  // Entries held at the step, or the shown series' value there (NaN: grey).
  float hi = 1;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k)
      if (std::isfinite(grid_value(l, k))) hi = std::max(hi, grid_value(l, k));
  ColorScale cs;
  cs.lo = 0;
  cs.hi = hi;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k) {
      QRectF c = grid_cell(area, l, k);
      float v = grid_value(l, k);
      p.fillRect(c, std::isfinite(v) ? QColor(cs.color(v)) : palette::kLightGrey);
    }
  for (int l = 0; l < layers; ++l)
    if (is_window_row(windows, l)) {
      const QRectF row = grid_cell(area, l, 0);
      paint_window_bar(p, g.right(), row.top() + 1, row.bottom() - 1);
    }
  p.setPen(QPen(Qt::white, 2));
  p.setBrush(Qt::NoBrush);
  p.drawRect(grid_cell(area, layer, kv_head));
  plot::axes(p, g, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
  plot::colorbar(p, QRectF(g.right() + 8, g.top(), 10, g.height()), cs, "");
  p.save();
  p.setFont(plot::font(8));
  p.setPen(QColor(60, 60, 60));
  QString what = shown_series >= 0 ? QString("%1 at step %2").arg(series_name).arg(step)
                                   : QString("entries held at step %1").arg(step);
  // Under the grid's axis label, elided to the grid's width.
  QFontMetricsF fm(p.font());
  p.drawText(QRectF(g.left() - 50, g.bottom() + 36, g.width() + 100, fm.height() + 2),
             Qt::AlignHCenter | Qt::AlignTop, fm.elidedText(what, Qt::ElideRight, g.width() + 100));
  const QString windows_caption = window_layers_caption(windows);
  if (!windows_caption.isEmpty())
    p.drawText(
        QRectF(g.left() - 50, g.bottom() + 38 + fm.height(), g.width() + 100, fm.height() + 2),
        Qt::AlignHCenter | Qt::AlignTop,
        fm.elidedText(windows_caption, Qt::ElideRight, g.width() + 100));
  p.restore();
}

void BudgetFigure::paint_series(QPainter& p, const QRectF& r) const {
  int64_t hi = std::max<int64_t>(1, budget_kind == "head" ? budget : 0);
  for (const auto& s : layer_series)
    hi = std::max<int64_t>(hi, *std::max_element(s.begin(), s.end()));
  hi = int64_t(double(hi) * 1.08) + 1;
  plot::Map mx{0, double(std::max<int64_t>(1, n_steps - 1)), r.left(), r.right()};
  plot::Map my{0, double(hi), r.bottom(), r.top()};
  p.save();
  p.setClipRect(r);
  // Stacked tiers of the current head, cumulative from the hottest tier.
  std::vector<double> base(size_t(n_steps), 0.0);
  for (int64_t t = 0; t < tiers; ++t) {
    QPolygonF poly;
    for (int64_t s = 0; s < n_steps; ++s) poly << QPointF(mx(double(s)), my(base[size_t(s)]));
    for (int64_t s = n_steps - 1; s >= 0; --s) {
      base[size_t(s)] += series[size_t(s * tiers + t)];
      poly << QPointF(mx(double(s)), my(base[size_t(s)]));
    }
    QColor c = palette::tier(int(t));
    c.setAlpha(170);
    p.setPen(Qt::NoPen);
    p.setBrush(c);
    p.drawPolygon(poly);
  }
  // The other heads of the layer, as thin lines.
  for (size_t k = 0; k < layer_series.size(); ++k) {
    if (int(k) == kv_head) continue;
    QPolygonF line;
    for (int64_t s = 0; s < n_steps; ++s)
      line << QPointF(mx(double(s)), my(layer_series[k][size_t(s)]));
    p.setPen(QPen(QColor(90, 90, 90, 110), 1));
    p.setBrush(Qt::NoBrush);
    p.drawPolyline(line);
  }
  if (budget_kind == "head" && budget > 0) {
    p.setPen(QPen(Qt::black, 1, Qt::DashLine));
    p.drawLine(QPointF(r.left(), my(double(budget))), QPointF(r.right(), my(double(budget))));
  }
  p.setPen(QPen(palette::kVermillion, 1.5));
  p.drawLine(QPointF(mx(double(step)), r.top()), QPointF(mx(double(step)), r.bottom()));
  p.restore();
  plot::axes(p, r, 0, double(std::max<int64_t>(1, n_steps - 1)), 0, double(hi), "step", "entries");
}

void BudgetFigure::paint_head_series(QPainter& p, const QRectF& r) const {
  const bool entries = series_units.contains("entries");
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : head_series)
    for (float v : s)
      if (std::isfinite(v)) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
  if (entries)
    for (int64_t s = 0; s < n_steps; ++s) hi = std::max(hi, double(series[size_t(s * tiers)]));
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (entries) lo = 0;  // entries count from zero
  double pad = hi > lo ? (hi - lo) * 0.06 : 0.5;
  if (!entries) lo -= pad;
  hi += pad;
  plot::Map mx{0, double(std::max<int64_t>(1, n_steps - 1)), r.left(), r.right()};
  plot::Map my{lo, hi, r.bottom(), r.top()};
  p.save();
  p.setClipRect(r);
  // The current head's hot-tier entries, for comparison with its budget.
  if (entries) {
    QPolygonF area;
    area << QPointF(mx(0), my(0));
    for (int64_t s = 0; s < n_steps; ++s)
      area << QPointF(mx(double(s)), my(series[size_t(s * tiers)]));
    area << QPointF(mx(double(n_steps - 1)), my(0));
    QColor c = palette::tier(0);
    c.setAlpha(110);
    p.setPen(Qt::NoPen);
    p.setBrush(c);
    p.drawPolygon(area);
  }
  // Each head's series, broken at NaN holes; the current head last, on top.
  auto draw = [&](const std::vector<float>& v, const QPen& pen) {
    p.setPen(pen);
    p.setBrush(Qt::NoBrush);
    QPolygonF run;
    for (size_t s = 0; s <= v.size(); ++s) {
      if (s < v.size() && std::isfinite(v[s])) {
        run << QPointF(mx(double(s)), my(v[s]));
      } else if (!run.isEmpty()) {
        run.size() == 1 ? p.drawPoint(run.front()) : p.drawPolyline(run);
        run.clear();
      }
    }
  };
  for (size_t k = 0; k < head_series.size(); ++k)
    if (int(k) != kv_head) draw(head_series[k], QPen(QColor(90, 90, 90, 150), 1));
  if (size_t(kv_head) < head_series.size())
    draw(head_series[size_t(kv_head)], QPen(Qt::black, 2.2));
  p.setPen(QPen(palette::kVermillion, 1.5));
  p.drawLine(QPointF(mx(double(step)), r.top()), QPointF(mx(double(step)), r.bottom()));
  p.restore();
  QString units =
      series_units.isEmpty() || series_units == "1" ? QString() : " (" + series_units + ")";
  QFontMetricsF fm(plot::font(9), p.device());
  plot::axes(p, r, 0, double(std::max<int64_t>(1, n_steps - 1)), lo, hi, "step",
             fm.elidedText(series_name + units, Qt::ElideRight, r.height() * 0.95));
}

void BudgetFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(
      p, QRectF(area.left(), area.top(), area.width(), 30), title(),
      shown_series >= 0 ? series_meaning : QString("budget: %1 %2").arg(budget_kind).arg(budget));
  if (n_steps == 0) return plot::message(p, area, "no steps yet");
  paint_grid(p, area);
  paint_channels(p, area);
  Layout l = series_layout(area, p.device());
  if (shown_series >= 0)
    paint_head_series(p, l.plot);
  else
    paint_series(p, l.plot);
  paint_legend_rows(p, l.legend, legend_entries(l.compact));
}

void BudgetFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "step,layer,kv_head,tier,entries\n";
  for (int64_t s = 0; s < n_steps; ++s)
    for (int64_t t = 0; t < tiers; ++t)
      out << s << ',' << layer << ',' << kv_head << ',' << tier_names[size_t(t)] << ','
          << series[size_t(s * tiers + t)] << '\n';
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k)
      for (int64_t t = 0; t < tiers; ++t)
        out << step << ',' << l << ',' << k << ',' << tier_names[size_t(t)] << ','
            << at_step[size_t((l * kv_heads + k) * tiers + t)] << '\n';
  // The current head's pruned key channels at the step: tier column
  // "pruned_key_channel", entries column the channel.
  for (int c : pruned_channels)
    out << step << ',' << layer << ',' << kv_head << ",pruned_key_channel," << c << '\n';
  // The shown series of every head of the layer: tier column "series:NAME".
  for (size_t k = 0; k < head_series.size(); ++k)
    for (int64_t s = 0; s < n_steps; ++s)
      out << s << ',' << layer << ',' << k << ",series:" << series_name << ','
          << head_series[k][size_t(s)] << '\n';
}

}  // namespace kvscope::views
