#include "views/gates_figure.h"

#include <algorithm>
#include <cmath>

#include "core/analysis/lifetimes.h"
#include "views/legend.h"

namespace kvscope::views {

std::shared_ptr<GatesFigure> GatesFigure::load(TraceData& data, const Selection& sel, int gate) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<GatesFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->selected_token = sel.token();
  f->spans = task_spans(data.basics().tokens);
  for (const trace::GateSpec& g : r.layout().gates) f->gate_names << QString::fromStdString(g.name);
  if (gate < 0 || gate >= int(r.layout().gates.size())) return f;
  const trace::GateSpec& spec = r.layout().gates[size_t(gate)];
  f->gate = gate;
  f->gate_name = QString::fromStdString(spec.name);
  f->meaning = QString::fromStdString(spec.meaning);
  f->threshold = spec.threshold;
  f->values = r.gate_values(gate, f->layer, f->kv_head);
  trace::HeadLifetimes lt = r.lifetimes(f->layer, f->kv_head);
  int64_t step = std::max<int64_t>(0, std::min(sel.step, r.n_steps() - 1));
  for (size_t t = 0; t < lt.admit_step.size(); ++t)
    f->held.push_back(analysis::held_at(lt.admit_step[t], lt.evict_step[t], step));
  f->fit_axis();
  return f;
}

void GatesFigure::fit_axis() {
  float a = INFINITY, b = -INFINITY;
  for (float v : values)
    if (v == v) a = std::min(a, v), b = std::max(b, v);
  if (!std::isfinite(a)) a = 0, b = 1;
  if (std::isfinite(threshold))
    a = std::min(a, float(threshold)), b = std::max(b, float(threshold));
  log_scale = a > 0 && b / a > 100;
  a = float(axis(a));
  b = float(axis(b));
  if (log_scale) a = std::floor(a), b = std::ceil(b);  // whole decades
  if (b <= a) b = a + 1;
  lo = a;
  hi = b;
  histogram.assign(kBins, 0);
  for (float v : values)
    if (v == v)
      ++histogram[size_t(std::clamp(int((axis(v) - lo) / (hi - lo) * kBins), 0, kBins - 1))];
}

QString GatesFigure::title() const {
  return QString("Gate scores · %1 · layer %2 · kv head %3").arg(gate_name).arg(layer).arg(kv_head);
}

QString GatesFigure::missing_data() const {
  return gate < 0 ? "this trace records no gate scores" : QString();
}

void GatesFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(), meaning);
  QRectF inner = area.adjusted(64, 40, -24, -50);
  if (gate < 0) return plot::message(p, inner, missing_data());
  // The legend flows above the strip, never over its bars.
  std::vector<LegendEntry> legend = {legend_box("held at step", palette::kBlue),
                                     legend_box("not held", palette::kGrey)};
  if (std::isfinite(threshold))
    legend.push_back(legend_line("threshold", QPen(palette::kVermillion, 1.5, Qt::DashLine)));
  add_task_legend(legend, spans);
  double lh = legend_height(legend, inner.width());
  paint_legend_rows(p, QRectF(inner.left(), inner.top(), inner.width(), lh), legend);
  inner.setTop(inner.top() + lh + 6);
  QRectF strip(inner.left(), inner.top(), inner.width() * 0.66, inner.height());
  QRectF hist(strip.right() + 60, inner.top(), inner.right() - strip.right() - 60, inner.height());
  int64_t T = int64_t(values.size());
  plot::Map mx{0, double(std::max<int64_t>(1, T)), strip.left(), strip.right()};
  plot::Map my{lo, hi, strip.bottom(), strip.top()};
  // One bar per pixel column: the max and mean of the tokens under it.
  int cols = std::max(1, int(strip.width()));
  double per_px = double(T) / cols;
  for (int x = 0; x < cols && T > 0; ++x) {
    int64_t a = int64_t(x * per_px), b = std::max<int64_t>(a + 1, int64_t((x + 1) * per_px));
    float mx_v = -INFINITY;
    double sum = 0;
    int64_t n = 0, held_n = 0;
    for (int64_t t = a; t < std::min(b, T); ++t) {
      float v = values[size_t(t)];
      if (v != v) continue;
      mx_v = std::max(mx_v, v);
      sum += v;
      ++n;
      held_n += t < int64_t(held.size()) && held[size_t(t)];
    }
    if (n == 0) continue;
    QColor c = held_n * 2 >= n ? palette::kBlue : palette::kGrey;
    p.setPen(QPen(c, std::max(1.0, strip.width() / std::max<int64_t>(1, T))));
    p.drawLine(QPointF(strip.left() + x + 0.5, my(lo)),
               QPointF(strip.left() + x + 0.5, my(axis(mx_v))));
  }
  if (std::isfinite(threshold)) {
    p.setPen(QPen(palette::kVermillion, 1.5, Qt::DashLine));
    p.drawLine(QPointF(strip.left(), my(axis(threshold))),
               QPointF(strip.right(), my(axis(threshold))));
  }
  if (selected_token >= 0 && selected_token < T) {
    p.setPen(QPen(Qt::black, 1, Qt::DotLine));
    p.drawLine(QPointF(mx(selected_token + 0.5), strip.top()),
               QPointF(mx(selected_token + 0.5), strip.bottom()));
  }
  paint_task_spans(p, strip, mx, Qt::Horizontal, spans);
  plot::axes(p, strip, 0, double(T), lo, hi, "token",
             log_scale ? gate_name + " (log10)" : gate_name);
  // Histogram, horizontal bars on the same value axis as the strip.
  int64_t peak = std::max<int64_t>(1, *std::max_element(histogram.begin(), histogram.end()));
  plot::Map hx{0, double(peak), hist.left(), hist.right()};
  plot::Map hy{lo, hi, hist.bottom(), hist.top()};
  p.setPen(Qt::NoPen);
  p.setBrush(palette::kSky);
  for (int i = 0; i < kBins; ++i) {
    double v0 = lo + (hi - lo) * i / kBins, v1 = lo + (hi - lo) * (i + 1) / kBins;
    p.drawRect(QRectF(QPointF(hx(0), hy(v1)), QPointF(hx(double(histogram[size_t(i)])), hy(v0))));
  }
  if (std::isfinite(threshold)) {
    p.setPen(QPen(palette::kVermillion, 1.5, Qt::DashLine));
    p.drawLine(QPointF(hist.left(), hy(axis(threshold))),
               QPointF(hist.right(), hy(axis(threshold))));
  }
  plot::axes(p, hist, 0, double(peak), lo, hi, "tokens", "");
}

void GatesFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "; threshold " << threshold << "\n";
  out << "token,score,held_at_step\n";
  for (size_t t = 0; t < values.size(); ++t)
    out << t << ',' << values[t] << ',' << (t < held.size() ? int(held[t]) : 0) << '\n';
}

}  // namespace kvscope::views
