#include "views/compare_figure.h"

#include "views/legend.h"

#include <QFileInfo>
#include <QFontMetricsF>
#include <algorithm>
#include <cmath>

#include "core/analysis/why.h"

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

// White to blue for A's side (v > 0), white to orange for B's (v < 0).
QColor diverging(double v) {
  const QColor base = v >= 0 ? palette::kBlue : palette::kOrange;
  const double a = std::min(1.0, std::abs(v));
  return QColor(int(255 + a * (base.red() - 255)), int(255 + a * (base.green() - 255)),
                int(255 + a * (base.blue() - 255)));
}

// The focus span: the selected tokens, else the needle of A.
std::vector<int64_t> focus_span(const Selection& sel, const TaskSpans& spans, int64_t n_tokens,
                                QString* name) {
  std::vector<int64_t> out;
  for (int64_t t : sel.tokens)
    if (t >= 0 && t < n_tokens) out.push_back(t);
  *name = out.empty() ? QString() : "selection";
  if (!out.empty()) return out;
  for (const auto& [b, e] : spans.needle)
    for (int64_t t = b; t < e; ++t) out.push_back(t);
  if (!out.empty()) *name = "needle";
  return out;
}

// Mean over kv heads of the received mass on `span` at each decode step of
// A (B at its aligned step); NaN before the first decode step. Each trace's
// curve is cached in its TraceData, so a step change does not re-read it.
void span_masses(TraceData& a, TraceData& b, const std::vector<int64_t>& span,
                 const std::vector<int64_t>& step_b, int64_t first_decode, std::vector<double>* ma,
                 std::vector<double>* mb) {
  ma->assign(step_b.size(), NAN);
  mb->assign(step_b.size(), NAN);
  if (span.empty() || first_decode < 0) return;
  const std::vector<int32_t> tokens(span.begin(), span.end());
  const std::vector<double>& curve_a = a.span_mass(tokens);
  const std::vector<double>& curve_b = b.span_mass(tokens);
  for (int64_t s = first_decode; s < int64_t(step_b.size()); ++s) {
    if (s < int64_t(curve_a.size())) (*ma)[size_t(s)] = curve_a[size_t(s)];
    const int64_t sb = step_b[size_t(s)];
    if (sb >= 0 && sb < int64_t(curve_b.size())) (*mb)[size_t(s)] = curve_b[size_t(sb)];
  }
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
  f->step_b = analysis::aligned_step(b.basics().fed_step, a.basics().steps, f->step_a);
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
  // Only tokens both traces fed alike compare.
  f->span = focus_span(sel, f->spans, f->shared_tokens, &f->span_name);
  std::vector<int64_t> step_b(size_t(f->steps_a));
  for (int64_t s = 0; s < f->steps_a; ++s)
    step_b[size_t(s)] = analysis::aligned_step(b.basics().fed_step, a.basics().steps, s);
  f->span_diff = analysis::diff_span(la, lb, f->span, step_b);
  f->answer_step = a.basics().first_decode_step();
  span_masses(a, b, f->span, step_b, f->answer_step, &f->span_mass_a, &f->span_mass_b);
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
      p.fillRect(QRectF(r.left() + k * cw, r.top() + l * ch, cw + 0.3, ch + 0.3),
                 diverging(double(h.only_a - h.only_b) / double(peak)));
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
    const double v = 1.0 - 2.0 * (y + 0.5) / r.height();  // +1 at the top, -1 at the bottom
    p.fillRect(QRectF(r.left(), r.top() + y, r.width(), 1.01), diverging(v));
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
  if (r.height() >= 3 * fm.height()) tick(r.center().y(), "0");  // room between the ends
  if (r.height() >= fm.height()) tick(r.bottom(), QString("B %1").arg(peak));
  p.restore();
}

// Heads (rows, layer by layer) x steps of A: the share of the span held by
// A and not B (blue) or by B and not A (orange), on the diff map's scale.
void CompareFigure::paint_span_heads(QPainter& p, const QRectF& r) const {
  const int64_t H = span_diff.heads, S = span_diff.steps;
  if (H > 0 && S > 0) {
    QImage img(int(S), int(H), QImage::Format_RGB32);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        img.setPixel(int(s), int(h),
                     diverging(double(span_diff.at(span_diff.only_a, h, s) -
                                      span_diff.at(span_diff.only_b, h, s)))
                         .rgb());
    p.save();
    p.setRenderHint(QPainter::SmoothPixmapTransform, false);
    p.drawImage(r, img);
    p.restore();
  }
  const plot::Map mx{0, double(std::max<int64_t>(1, S)), r.left(), r.right()};
  p.save();
  if (answer_step >= 0) {
    p.setPen(QPen(palette::kVermillion, 1.5, Qt::DotLine));
    p.drawLine(QPointF(mx(answer_step + 0.5), r.top()), QPointF(mx(answer_step + 0.5), r.bottom()));
  }
  p.setPen(QPen(Qt::black, 1, Qt::DashLine));
  p.drawLine(QPointF(mx(step_a + 0.5), r.top()), QPointF(mx(step_a + 0.5), r.bottom()));
  p.restore();
  plot::axes(p, r, 0, double(std::max<int64_t>(1, S)), 0, double(layers), "step",
             "layer (kv heads within)", true);
}

// Attention on the span at each decode step: A's and B's received mass,
// mean over kv heads.
void CompareFigure::paint_span_mass(QPainter& p, const QRectF& r) const {
  const double hi = plot::finite_max({&span_mass_a, &span_mass_b}, 1e-3) * 1.1;
  const double x1 = double(std::max<int64_t>(1, steps_a - 1));
  const plot::Map mx{0, x1, r.left(), r.right()}, my{0, hi, r.bottom(), r.top()};
  p.save();
  p.setClipRect(r.adjusted(-3, -3, 3, 3));
  if (answer_step >= 0)
    plot::vertical_line(p, r, mx(double(answer_step)),
                        QPen(palette::kVermillion, 1.5, Qt::DotLine));
  plot::series(p, span_mass_b, mx, my, QPen(palette::kOrange, 2, Qt::DashLine));
  plot::series(p, span_mass_a, mx, my, QPen(palette::kBlue, 2));
  p.restore();
  plot::axes(p, r, 0, x1, 0, hi, "step", "attention on " + span_name);
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
  // Each panel keeps 56 px left of it for y ticks and label and 44 px below
  // for x ticks and label; the diff map's colour bar takes 60 px right of it.
  auto inner = [&](double legend_h) { return top_area.adjusted(56, legend_h + 10, -12, -44); };
  double lh = legend_height(legend, top_area.width());
  QRectF in = inner(lh);
  // A paper column shows the first row alone (where the policies differ);
  // taller pages add the focus span over the steps (its step lines keyed),
  // then survival and the budget over steps.
  bool one_row = in.width() < 480 || in.height() < 320;
  if (!one_row && !span.empty()) {
    legend.push_back(legend_line("answer step", QPen(palette::kVermillion, 1.5, Qt::DotLine)));
    legend.push_back(legend_line("current step", QPen(Qt::black, 1, Qt::DashLine)));
    lh = legend_height(legend, top_area.width());
    in = inner(lh);
    one_row = in.height() < 320;
    if (one_row) legend.resize(legend.size() - 2);
    lh = legend_height(legend, top_area.width());
    in = inner(lh);
  }
  paint_legend_rows(p, QRectF(top_area.left(), top_area.top(), top_area.width(), lh), legend);
  const bool span_row = !one_row && !span.empty();
  const bool last_row = !one_row && (span.empty() || in.height() >= 560);
  const int rows = 1 + int(span_row) + int(last_row);
  const double row_gap = 44 + 16;
  const double row_h = (in.height() - row_gap * (rows - 1)) / rows;
  QRectF grid(in.left(), in.top(), std::min(in.width() * 0.28, 40.0 * double(kv_heads)), row_h);
  QRectF bar(grid.right() + 8, grid.top(), 10, grid.height());
  QRectF strip(bar.right() + 60, in.top(), std::max(10.0, in.right() - bar.right() - 60),
               std::min(34.0, row_h));
  paint_heads(p, grid);
  paint_diff_bar(p, bar);
  paint_tokens(p, strip);
  double top = grid.bottom() + row_gap;
  if (span_row) {
    // Captions above the span's panels, in the gap the row keeps for them.
    const double caption_h = QFontMetricsF(plot::font(8, true)).height() + 4;
    QRectF held(in.left(), top + caption_h, in.width() * 0.46, row_h - caption_h);
    QRectF mass(held.right() + 64, held.top(), std::max(10.0, in.right() - held.right() - 64),
                held.height());
    p.save();
    p.setFont(plot::font(8, true));
    p.setPen(Qt::black);
    const QFontMetricsF fm(p.font(), p.device());
    auto caption = [&](const QRectF& panel, const QString& text) {
      p.drawText(QRectF(panel.left(), top, panel.width(), caption_h - 2),
                 Qt::AlignLeft | Qt::AlignVCenter,
                 fm.elidedText(text, Qt::ElideRight, panel.width()));
    };
    caption(held, QString("%1 (%2 tokens) held by A only (blue) or B only (orange), per kv head")
                      .arg(span_name)
                      .arg(span.size()));
    caption(mass, QString("attention on the %1: A (solid) and B (dashed)").arg(span_name));
    p.restore();
    paint_span_heads(p, held);
    paint_span_mass(p, mass);
    top += row_h + row_gap;
  }
  if (!last_row) return;
  QRectF surv(in.left(), top, in.width() * 0.46, row_h);
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
  if (span.empty()) return;
  // The focus span over A's steps: per head the shares held by one trace
  // only, and each trace's attention on it (empty before decoding).
  out << "\n# " << span_name << ": " << span.size() << " tokens from token " << span.front()
      << "\nstep,layer,kv_head,span_only_a,span_only_b,attention_a,attention_b\n";
  for (int64_t s = 0; s < span_diff.steps; ++s)
    for (int64_t h = 0; h < span_diff.heads; ++h) {
      out << s << ',' << h / kv_heads << ',' << h % kv_heads << ','
          << span_diff.at(span_diff.only_a, h, s) << ',' << span_diff.at(span_diff.only_b, h, s)
          << ',';
      if (!std::isnan(span_mass_a[size_t(s)])) out << span_mass_a[size_t(s)];
      out << ',';
      if (!std::isnan(span_mass_b[size_t(s)])) out << span_mass_b[size_t(s)];
      out << '\n';
    }
}

}  // namespace kvscope::views
