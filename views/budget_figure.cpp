#include "views/budget_figure.h"

#include <QFontMetricsF>
#include <algorithm>

namespace kvscope::views {

std::shared_ptr<BudgetFigure> BudgetFigure::load(TraceData& data, const Selection& sel) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<BudgetFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->n_steps = r.n_steps();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  f->tiers = r.n_tiers();
  f->budget_kind = QString::fromStdString(r.run().budget_kind);
  f->budget = r.run().budget;
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
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
// The grid's y-axis label sits left of the tick labels: 72 px leaves room for
// both at any layer count.
QRectF grid_area(const QRectF& area) {
  QRectF inner = area.adjusted(8, 36, -8, -8);
  return QRectF(inner.left() + 72, inner.top(), inner.width() * 0.36 - 72, inner.height() - 40);
}
}  // namespace

std::vector<std::pair<QColor, QString>> BudgetFigure::legend_items() const {
  std::vector<std::pair<QColor, QString>> items;
  for (int64_t t = 0; t < tiers; ++t)
    items.push_back({palette::tier(int(t)), tier_names[size_t(t)]});
  items.push_back({QColor(90, 90, 90), "other heads of layer"});
  if (budget_kind == "head" && budget > 0) items.push_back({Qt::black, "budget"});
  return items;
}

// The series plot leaves room on its right for the legend's longest entry.
QRectF BudgetFigure::series_area(QPainter& p, const QRectF& area) const {
  QRectF inner = area.adjusted(8, 36, -8, -8);
  // Measured on the painter's device: exports render at their own DPI.
  QFontMetricsF fm(plot::font(8), p.device());
  double legend = 0;
  for (const auto& item : legend_items())
    legend = std::max(legend, fm.horizontalAdvance(item.second));
  double left = inner.left() + inner.width() * 0.36 + 110;
  return QRectF(left, inner.top(), inner.right() - left - (legend + 40), inner.height() - 40);
}

QRectF BudgetFigure::grid_cell(const QRectF& area, int l, int k) const {
  QRectF g = grid_area(area);
  double cw = g.width() / std::max<int64_t>(1, kv_heads),
         ch = g.height() / std::max<int64_t>(1, layers);
  return QRectF(g.left() + k * cw, g.top() + l * ch, cw, ch);
}

void BudgetFigure::paint_grid(QPainter& p, const QRectF& area) const {
  QRectF g = grid_area(area);
  int64_t hi = 1;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k) hi = std::max(hi, head_total(l, k));
  ColorScale cs;
  cs.lo = 0;
  cs.hi = float(hi);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k) {
      QRectF c = grid_cell(area, l, k);
      p.fillRect(c, QColor(cs.color(float(head_total(l, k)))));
    }
  p.setPen(QPen(Qt::white, 2));
  p.setBrush(Qt::NoBrush);
  p.drawRect(grid_cell(area, layer, kv_head));
  plot::axes(p, g, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
  plot::colorbar(p, QRectF(g.right() + 8, g.top(), 10, g.height()), cs, "");
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
  plot::legend(p, QPointF(r.right() + 10, r.top()), legend_items());
}

void BudgetFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(),
              QString("budget: %1 %2").arg(budget_kind).arg(budget));
  if (n_steps == 0) return plot::message(p, area, "no steps yet");
  paint_grid(p, area);
  paint_series(p, series_area(p, area));
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
}

}  // namespace kvscope::views
