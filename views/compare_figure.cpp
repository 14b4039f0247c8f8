#include "views/compare_figure.h"

#include "views/legend.h"

#include <QFileInfo>
#include <QFontMetricsF>
#include <algorithm>

#include "views/survival_figure.h"

namespace kvscope::views {

namespace {

std::vector<int64_t> head_budget(const trace::TraceReader& r, int layer, int kv_head) {
  int64_t S = r.n_steps(), R = r.n_tiers();
  std::vector<int32_t> s =
      S > 0 ? r.occupancy_series(layer, kv_head, 0, S) : std::vector<int32_t>{};
  std::vector<int64_t> out(size_t(S), 0);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t t = 0; t < R; ++t) out[size_t(i)] += s[size_t(i * R + t)];
  return out;
}

QColor diff_color(uint8_t d) {
  switch (d) {
    case analysis::kOnlyA: return palette::kBlue;
    case analysis::kOnlyB: return palette::kOrange;
    case analysis::kHeldByBoth: return QColor(120, 120, 120);
    default: return QColor(245, 245, 245);
  }
}

}  // namespace

std::shared_ptr<CompareFigure> CompareFigure::load(TraceData& a, TraceData& b,
                                                   const Selection& sel) {
  const trace::TraceReader& ra = a.reader();
  const trace::TraceReader& rb = b.reader();
  analysis::check_comparable(ra, rb);
  auto f = std::make_shared<CompareFigure>();
  f->name_a = QFileInfo(QString::fromStdString(ra.path())).fileName() + " (" +
              QString::fromStdString(ra.run().policy) + ")";
  f->name_b = QFileInfo(QString::fromStdString(rb.path())).fileName() + " (" +
              QString::fromStdString(rb.run().policy) + ")";
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->spans = task_spans(a.basics().tokens);
  f->layers = ra.n_layers();
  f->kv_heads = ra.n_kv_heads();
  f->steps_a = ra.n_steps();
  f->steps_b = rb.n_steps();
  f->step_a = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->steps_a - 1));
  f->step_b = analysis::aligned_step(b.basics().fed_step, ra, f->step_a);
  const analysis::AllLifetimes& la = a.all_lifetimes();
  const analysis::AllLifetimes& lb = b.all_lifetimes();
  f->shared_tokens = analysis::shared_prefix(ra, rb);
  f->heads = analysis::diff_heads(la, lb, f->step_a, f->step_b, f->shared_tokens);
  f->tokens =
      analysis::diff_tokens(la, lb, f->layer, f->kv_head, f->step_a, f->step_b, f->shared_tokens);
  int64_t max_h = std::max<int64_t>(0, std::min(a.basics().n_tokens, b.basics().n_tokens) / 2);
  f->survival_a =
      analysis::survival(ra.lifetimes(f->layer, f->kv_head), a.basics().fed_step,
                         a.last_attended(f->layer, f->kv_head).head(f->layer, f->kv_head), max_h);
  f->survival_b =
      analysis::survival(rb.lifetimes(f->layer, f->kv_head), b.basics().fed_step,
                         b.last_attended(f->layer, f->kv_head).head(f->layer, f->kv_head), max_h);
  f->budget_a = head_budget(ra, f->layer, f->kv_head);
  f->budget_b = head_budget(rb, f->layer, f->kv_head);
  return f;
}

QString CompareFigure::title() const {
  return QString("Compare · layer %1 · kv head %2 · step %3 (B: %4) · %5 shared tokens")
      .arg(layer)
      .arg(kv_head)
      .arg(step_a)
      .arg(step_b)
      .arg(shared_tokens);
}

void CompareFigure::paint_heads(QPainter& p, const QRectF& r) const {
  // Colour: tokens held by exactly one of the two, signed A-only minus B-only.
  int64_t peak = 1;
  for (const auto& h : heads) peak = std::max<int64_t>(peak, std::max(h.only_a, h.only_b));
  double cw = r.width() / std::max<int64_t>(1, kv_heads),
         ch = r.height() / std::max<int64_t>(1, layers);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k) {
      const auto& h = heads[size_t(l * kv_heads + k)];
      double v = double(h.only_a - h.only_b) / double(peak);
      QColor base = v >= 0 ? palette::kBlue : palette::kOrange;
      double a = std::min(1.0, std::abs(v));
      QColor c(int(255 + a * (base.red() - 255)), int(255 + a * (base.green() - 255)),
               int(255 + a * (base.blue() - 255)));
      p.fillRect(QRectF(r.left() + k * cw, r.top() + l * ch, cw + 0.3, ch + 0.3), c);
    }
  p.setPen(QPen(Qt::black, 2));
  p.setBrush(Qt::NoBrush);
  p.drawRect(QRectF(r.left() + kv_head * cw, r.top() + layer * ch, cw, ch));
  plot::axes(p, r, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
}

void CompareFigure::paint_tokens(QPainter& p, const QRectF& r) const {
  int64_t T = int64_t(tokens.size());
  int cols = std::max(1, int(r.width()));
  // Fold tokens per pixel column: the majority class wins.
  for (int x = 0; x < cols && T > 0; ++x) {
    int64_t a = int64_t(double(x) * T / cols),
            b = std::max<int64_t>(a + 1, int64_t(double(x + 1) * T / cols));
    int n[4] = {0, 0, 0, 0};
    for (int64_t t = a; t < std::min(b, T); ++t) ++n[tokens[size_t(t)]];
    int best = int(std::max_element(n + 1, n + 4) - n);
    if (n[best] == 0) best = 0;
    p.fillRect(QRectF(r.left() + x, r.top(), 1.01, r.height()), diff_color(uint8_t(best)));
  }
  paint_task_spans(p, r, plot::Map{0, double(std::max<int64_t>(1, T)), r.left(), r.right()},
                   Qt::Horizontal, spans);
  plot::x_axis(p, r, 0, double(T), "token (current head)");
}

void CompareFigure::paint_budget(QPainter& p, const QRectF& r) const {
  int64_t S = std::max<int64_t>(steps_a, steps_b), hi = 1;
  for (int64_t v : budget_a) hi = std::max(hi, v);
  for (int64_t v : budget_b) hi = std::max(hi, v);
  plot::Map mx{0, double(std::max<int64_t>(1, S - 1)), r.left(), r.right()};
  plot::Map my{0, double(hi) * 1.05, r.bottom(), r.top()};
  for (int which = 0; which < 2; ++which) {
    const auto& v = which == 0 ? budget_a : budget_b;
    QPolygonF line;
    for (size_t s = 0; s < v.size(); ++s) line << QPointF(mx(double(s)), my(double(v[s])));
    QPen pen(which == 0 ? palette::kBlue : palette::kOrange, 2);
    if (which == 1) pen.setStyle(Qt::DashLine);
    p.setPen(pen);
    p.drawPolyline(line);
  }
  p.setPen(QPen(palette::kVermillion, 1));
  p.drawLine(QPointF(mx(double(step_a)), r.top()), QPointF(mx(double(step_a)), r.bottom()));
  plot::axes(p, r, 0, double(std::max<int64_t>(1, S - 1)), 0, double(hi) * 1.05, "step", "entries");
}

// The diff map's colour bar: tokens held only by A (blue, up) or only by B
// (orange, down) at a head, as a share of the busiest head's count.
void CompareFigure::paint_diff_bar(QPainter& p, const QRectF& r) const {
  int64_t peak = 1;
  for (const auto& h : heads) peak = std::max<int64_t>(peak, std::max(h.only_a, h.only_b));
  for (int y = 0; y < int(r.height()); ++y) {
    double v = 1.0 - 2.0 * (y + 0.5) / r.height();  // +1 at the top, -1 at the bottom
    QColor base = v >= 0 ? palette::kBlue : palette::kOrange;
    double a = std::min(1.0, std::abs(v));
    p.fillRect(QRectF(r.left(), r.top() + y, r.width(), 1.01),
               QColor(int(255 + a * (base.red() - 255)), int(255 + a * (base.green() - 255)),
                      int(255 + a * (base.blue() - 255))));
  }
  p.save();
  p.setPen(QPen(Qt::black, 1));
  p.setBrush(Qt::NoBrush);
  p.drawRect(r);
  p.setFont(plot::font(7));
  QFontMetricsF fm(p.font());
  auto tick = [&](double y, const QString& text) {
    p.drawLine(QPointF(r.right(), y), QPointF(r.right() + 3, y));
    p.drawText(QPointF(r.right() + 5, y + fm.ascent() / 2 - 1), text);
  };
  tick(r.top(), QString("A %1").arg(peak));
  tick(r.center().y(), "0");
  tick(r.bottom(), QString("B %1").arg(peak));
  p.restore();
}

void CompareFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title());
  // The legend flows above everything (names, then the strip's classes with
  // their counts): it never covers a plot.
  std::vector<LegendEntry> legend = {
      legend_line("A: " + name_a, QPen(palette::kBlue, 2)),
      legend_line("B: " + name_b, QPen(palette::kOrange, 2, Qt::DashLine))};
  static const char* names[] = {"held by neither", "kept by A, not B", "kept by B, not A",
                                "held by both"};
  for (uint8_t d : {uint8_t(analysis::kOnlyA), uint8_t(analysis::kOnlyB),
                    uint8_t(analysis::kHeldByBoth), uint8_t(analysis::kHeldByNeither)}) {
    int64_t n = std::count(tokens.begin(), tokens.end(), d);
    legend.push_back(legend_box(QString("%1: %2 tokens").arg(names[d]).arg(n), diff_color(d)));
  }
  add_task_legend(legend, spans);
  QRectF top_area = area.adjusted(8, 36, -8, -8);
  double lh = legend_height(legend, top_area.width());
  paint_legend_rows(p, QRectF(top_area.left(), top_area.top(), top_area.width(), lh), legend);
  // Each panel keeps 56 px left of it for y ticks and label and 44 px below
  // for x ticks and label; the diff map's colour bar takes 60 px right of it.
  QRectF in = top_area.adjusted(56, lh + 10, -12, -44);
  // A paper column shows the first row alone (where the policies differ);
  // wider pages add survival and the budget over steps.
  bool one_row = in.width() < 480 || in.height() < 320;
  double row_h = one_row ? in.height() : (in.height() - 44 - 16) / 2;
  QRectF grid(in.left(), in.top(), std::min(in.width() * 0.28, 40.0 * double(kv_heads)), row_h);
  QRectF bar(grid.right() + 8, grid.top(), 10, grid.height());
  QRectF strip(bar.right() + 60, in.top(), std::max(10.0, in.right() - bar.right() - 60),
               std::min(34.0, row_h));
  paint_heads(p, grid);
  paint_diff_bar(p, bar);
  paint_tokens(p, strip);
  if (one_row) return;
  QRectF surv(in.left(), grid.bottom() + 44 + 16, in.width() * 0.46, row_h);
  QRectF budget(surv.right() + 64, surv.top(), std::max(10.0, in.right() - surv.right() - 64),
                row_h);
  SurvivalFigure::paint_curves(p, surv,
                               {{&survival_a.held, QPen(palette::kBlue, 2)},
                                {&survival_b.held, QPen(palette::kOrange, 2, Qt::DashLine)}},
                               int64_t(survival_a.held.size()) - 1, -1);
  paint_budget(p, budget);
}

void CompareFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n# A: " << name_a << "\n# B: " << name_b << "\n";
  out << "layer,kv_head,only_a,only_b,both\n";
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t k = 0; k < kv_heads; ++k) {
      const auto& h = heads[size_t(l * kv_heads + k)];
      out << l << ',' << k << ',' << h.only_a << ',' << h.only_b << ',' << h.both << '\n';
    }
}

}  // namespace kvscope::views
