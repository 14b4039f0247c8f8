#include "views/survival_figure.h"

#include "views/legend.h"

#include <algorithm>

namespace kvscope::views {

std::shared_ptr<SurvivalFigure> SurvivalFigure::load(TraceData& data, const Selection& sel,
                                                     int64_t horizon) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<SurvivalFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  const TraceBasics& b = data.basics();
  int64_t T = b.n_tokens;
  // Up to half the tokens: beyond that so few tokens are observable that the
  // curves only show which early tokens (sinks) happen to be left.
  int64_t max_h = std::max<int64_t>(0, T / 2);
  f->horizon = horizon >= 0 ? std::min(horizon, max_h)
                            : std::min<int64_t>(max_h, std::max<int64_t>(1, T / 16));
  const analysis::LastAttended& last = data.last_attended(f->layer, f->kv_head);
  f->criterion = QString::fromStdString(last.criterion);
  trace::HeadLifetimes lt = r.lifetimes(f->layer, f->kv_head);
  f->curve = analysis::survival(lt, b.fed_step, last.head(f->layer, f->kv_head), max_h);
  for (int k = 0; k < f->kv_heads; ++k) {
    if (k == f->kv_head) {
      f->layer_held.push_back(f->curve.held);
      continue;
    }
    f->layer_held.push_back(
        analysis::survival(r.lifetimes(f->layer, k), b.fed_step, nullptr, max_h).held);
  }
  f->held_at_horizon = analysis::survival_at(data.all_lifetimes(), b.fed_step, f->horizon);
  return f;
}

QString SurvivalFigure::title() const {
  return QString("Survival · layer %1 · kv head %2").arg(layer).arg(kv_head);
}

void SurvivalFigure::paint_curves(
    QPainter& p, const QRectF& r,
    const std::vector<std::pair<const std::vector<double>*, QPen>>& curves, int64_t max_h,
    int64_t mark_h) {
  plot::Map mx{0, double(std::max<int64_t>(1, max_h)), r.left(), r.right()};
  plot::Map my{0, 1.0, r.bottom(), r.top()};
  p.save();
  p.setClipRect(r.adjusted(-2, -2, 2, 2));
  for (const auto& [values, pen] : curves) {
    if (!values || values->empty()) continue;
    // Fold to about one point per pixel column: a curve of any length costs
    // the same to draw.
    QPolygonF line;
    int64_t n = int64_t(values->size());
    double per_px = std::max(1.0, double(n) / std::max(1.0, r.width()));
    for (double i = 0; i < double(n); i += per_px)
      line << QPointF(mx(std::floor(i)), my((*values)[size_t(i)]));
    line << QPointF(mx(double(n - 1)), my(values->back()));
    p.setPen(pen);
    p.drawPolyline(line);
  }
  if (mark_h >= 0) {
    p.setPen(QPen(palette::kVermillion, 1, Qt::DotLine));
    p.drawLine(QPointF(mx(double(mark_h)), r.top()), QPointF(mx(double(mark_h)), r.bottom()));
  }
  p.restore();
  plot::axes(p, r, 0, double(std::max<int64_t>(1, max_h)), 0, 1, "horizon h (token positions)",
             "fraction of tokens");
}

void SurvivalFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(),
              criterion.isEmpty() ? "attention survival: not captured" : "attention: " + criterion);
  QRectF inner = area.adjusted(8, 36, -8, -8);
  if (curve.held.empty()) return plot::message(p, inner, "no tokens yet");
  // The per-head grid needs about 200 px beside the curves; narrower pages
  // (a paper column) show the curves alone.
  bool with_grid = inner.width() >= 560;
  double curves_w = with_grid ? inner.width() * 0.62 : inner.width();
  std::vector<LegendEntry> legend = {legend_line("held by the policy", QPen(palette::kBlue, 2.5))};
  if (!curve.attended.empty())
    legend.push_back(
        legend_line("still attended (" + criterion + ")", QPen(palette::kOrange, 2.5)));
  legend.push_back(legend_line("held, other heads of layer", QPen(QColor(150, 150, 150), 1)));
  // The legend flows above the curves: it never covers them.
  double lh = legend_height(legend, curves_w - 16);
  paint_legend_rows(p, QRectF(inner.left() + 8, inner.top(), curves_w - 16, lh), legend);
  QRectF left(inner.left() + 56, inner.top() + lh + 8, curves_w - 56 - 12,
              inner.height() - 44 - lh - 8);
  QRectF grid(left.right() + 70, left.top(), inner.right() - left.right() - 140, left.height());
  std::vector<std::pair<const std::vector<double>*, QPen>> curves;
  for (size_t k = 0; k < layer_held.size(); ++k)
    if (int(k) != kv_head) curves.push_back({&layer_held[k], QPen(QColor(150, 150, 150, 150), 1)});
  curves.push_back({&curve.held, QPen(palette::kBlue, 2.5)});
  if (!curve.attended.empty()) curves.push_back({&curve.attended, QPen(palette::kOrange, 2.5)});
  paint_curves(p, left, curves, int64_t(curve.held.size()) - 1, horizon);
  if (!with_grid) return;
  // Per-head survival at the chosen horizon.
  ColorScale cs;
  cs.lo = 0;
  cs.hi = 1;
  double cw = grid.width() / std::max<int64_t>(1, kv_heads),
         ch = grid.height() / std::max<int64_t>(1, layers);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k)
      p.fillRect(QRectF(grid.left() + k * cw, grid.top() + l * ch, cw + 0.3, ch + 0.3),
                 QColor(cs.color(float(held_at_horizon[size_t(l * kv_heads + k)]))));
  p.setPen(QPen(Qt::white, 2));
  p.drawRect(QRectF(grid.left() + kv_head * cw, grid.top() + layer * ch, cw, ch));
  plot::axes(p, grid, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
  plot::colorbar(p, QRectF(grid.right() + 8, grid.top(), 10, grid.height()), cs,
                 QString("held at h=%1").arg(horizon));
}

void SurvivalFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "; attention criterion: " << criterion << "\n";
  out << "h,at_risk,held,attended\n";
  for (size_t h = 0; h < curve.held.size(); ++h)
    out << h << ',' << curve.at_risk[h] << ',' << curve.held[h] << ','
        << (curve.attended.empty() ? QString() : QString::number(curve.attended[h])) << '\n';
}

}  // namespace kvscope::views
