#include "views/needle_figure.h"

#include <QFileInfo>
#include <algorithm>
#include <cmath>

#include "core/analysis/why.h"
#include "views/legend.h"
#include "views/task_marks.h"

namespace kvscope::views {

namespace {

const QColor kKeptColor{228, 228, 228};
// Never admitted: not a colour of the loss map (magma runs from black).
const QColor kNeverAdmittedColor{213, 94, 0};
const QColor kLostMassColor{110, 110, 110};

QString display_name(const trace::TraceReader& r) {
  return QFileInfo(QString::fromStdString(r.path())).fileName() + " (" +
         QString::fromStdString(r.run().policy) + ")";
}

std::vector<int64_t> needle_tokens(const TraceBasics& b) {
  std::vector<int64_t> out;
  for (size_t t = 0; t < b.tokens.size(); ++t)
    if (b.tokens[t].role == trace::TokenRole::Needle) out.push_back(int64_t(t));
  return out;
}

// Mean over kv heads of the received mass on `needle` (sorted) at each decode
// step from `first`; NaN elsewhere or without /attention/received.
std::vector<double> needle_mass(const trace::TraceReader& r, const std::vector<int64_t>& needle,
                                int64_t first) {
  std::vector<double> out(size_t(r.n_steps()), NAN);
  if (first < 0 || needle.empty()) return out;
  const std::vector<int32_t> tokens(needle.begin(), needle.end());
  for (int64_t s = first; s < r.n_steps(); ++s)
    out[size_t(s)] = analysis::received_mass_on(r, tokens, s);
  return out;
}

}  // namespace

std::shared_ptr<NeedleFigure> NeedleFigure::load(TraceData& data, TraceData* compare,
                                                 const Selection& sel) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<NeedleFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  f->n_steps = r.n_steps();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
  f->name = display_name(r);
  const TraceBasics& b = data.basics();
  f->needle = needle_tokens(b);
  f->answer_step = b.first_decode_step();
  for (int64_t t : f->needle)
    f->needle_text +=
        QString::fromUtf8(b.tokens[size_t(t)].text.data(), int(b.tokens[size_t(t)].text.size()));
  if (f->needle.empty()) return f;
  const analysis::AllLifetimes& all = data.all_lifetimes();
  const size_t n = f->needle.size();
  f->admit.assign(size_t(f->layers * f->kv_heads) * n, -1);
  f->evict.assign(f->admit.size(), -1);
  for (int64_t l = 0; l < f->layers; ++l)
    for (int64_t k = 0; k < f->kv_heads; ++k)
      for (size_t i = 0; i < n; ++i) {
        int64_t t = f->needle[i];
        if (t < all.token_begin || t >= all.token_end) continue;
        size_t at = size_t(l * f->kv_heads + k) * n + i;
        f->admit[at] = all.admit[all.index(l, k, t)];
        f->evict[at] = all.evict[all.index(l, k, t)];
      }
  f->mass = needle_mass(r, f->needle, f->answer_step);
  f->lost_mass.assign(size_t(f->n_steps), NAN);
  if (r.layout().oracle && f->answer_step >= 0)
    for (int64_t s = f->answer_step; s < f->n_steps; ++s) {
      std::vector<float> lost = r.oracle_lost_mass(s);
      double sum = 0;
      for (float x : lost) sum += x;
      if (!lost.empty()) f->lost_mass[size_t(s)] = sum / double(lost.size());
    }
  if (compare && compare != &data) {
    const TraceBasics& cb = compare->basics();
    f->compare_name = display_name(compare->reader());
    f->compare_mass = needle_mass(compare->reader(), needle_tokens(cb), cb.first_decode_step());
  }
  return f;
}

QString NeedleFigure::title() const {
  return QString("Needle · step %1 · layer %2 · kv head %3").arg(step).arg(layer).arg(kv_head);
}

double NeedleFigure::held_share(int l, int k, int64_t s) const {
  if (needle.empty()) return 0;
  size_t n = needle.size(), held = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t at = size_t(l * kv_heads + k) * n + i;
    held += analysis::held_at(admit[at], evict[at], s);
  }
  return double(held) / double(n);
}

void NeedleFigure::paint_grid(QPainter& p, const QRectF& r) const {
  ColorScale cs;  // 0..1 of the needle
  double cw = r.width() / std::max<int64_t>(1, kv_heads),
         ch = r.height() / std::max<int64_t>(1, layers);
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < kv_heads; ++k)
      p.fillRect(QRectF(r.left() + k * cw, r.top() + l * ch, cw + 0.3, ch + 0.3),
                 QColor(cs.color(float(held_share(l, k, step)))));
  p.setPen(QPen(Qt::white, 2));
  p.setBrush(Qt::NoBrush);
  p.drawRect(QRectF(r.left() + kv_head * cw, r.top() + layer * ch, cw, ch));
  plot::axes(p, r, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
  plot::colorbar(p, QRectF(r.right() + 8, r.top(), 10, r.height()), cs,
                 QString("needle held, step %1").arg(step));
}

void NeedleFigure::paint_losses(QPainter& p, const QRectF& r) const {
  const int64_t rows = layers * kv_heads, n = int64_t(needle.size());
  ColorScale cs;
  cs.map = ColorMapId::Magma;
  cs.lo = 0;
  cs.hi = float(std::max<int64_t>(1, n_steps - 1));
  double cw = r.width() / double(std::max<int64_t>(1, n)), ch = r.height() / double(rows);
  for (int64_t h = 0; h < rows; ++h)
    for (int64_t i = 0; i < n; ++i) {
      size_t at = size_t(h * n + i);
      QColor c = admit[at] < 0   ? kNeverAdmittedColor
                 : evict[at] < 0 ? kKeptColor
                                 : QColor(cs.color(float(evict[at])));
      p.fillRect(QRectF(r.left() + i * cw, r.top() + h * ch, cw + 0.3, ch + 0.3), c);
    }
  p.setPen(QPen(palette::kSky, 1.5));
  p.setBrush(Qt::NoBrush);
  p.drawRect(QRectF(r.left(), r.top() + (layer * kv_heads + kv_head) * ch, r.width(), ch));
  plot::axes(p, r, 0, double(n), 0, double(layers), "needle token", "layer (kv heads within)",
             true);
  std::vector<LegendEntry> key = {legend_box("kept", kKeptColor),
                                  legend_box("never admitted", kNeverAdmittedColor)};
  double key_h = legend_column_height(key);
  QRectF bar(r.right() + 8, r.top(), 10, std::max(10.0, r.height() - key_h));
  plot::colorbar(p, bar, cs, "lost at step");
  paint_legend_column(p, QPointF(bar.left() - 4, bar.bottom() + 8), 110, key);
}

void NeedleFigure::paint_mass(QPainter& p, const QRectF& r) const {
  const double hi = plot::finite_max({&mass, &compare_mass, &lost_mass}, 1e-3) * 1.1;
  plot::Map mx{0, double(std::max<int64_t>(1, n_steps - 1)), r.left(), r.right()};
  plot::Map my{0, hi, r.bottom(), r.top()};
  p.save();
  p.setClipRect(r.adjusted(-3, -3, 3, 3));
  if (answer_step >= 0)
    plot::vertical_line(p, r, mx(double(answer_step)),
                        QPen(palette::kVermillion, 1.5, Qt::DotLine));
  plot::vertical_line(p, r, mx(double(step)), QPen(QColor(150, 150, 150), 1, Qt::DashLine));
  plot::series(p, lost_mass, mx, my, QPen(kLostMassColor, 1.5, Qt::DotLine));
  plot::series(p, compare_mass, mx, my, QPen(palette::kOrange, 2, Qt::DashLine));
  plot::series(p, mass, mx, my, QPen(palette::kBlue, 2));
  p.restore();
  plot::axes(p, r, 0, double(std::max<int64_t>(1, n_steps - 1)), 0, hi, "step", "attention mass");
}

QString NeedleFigure::missing_data() const {
  return needle.empty() ? "this trace marks no needle tokens: capture a task (--task needle, niah, "
                          "defer) to follow one"
                        : QString();
}

void NeedleFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(
      p, QRectF(area.left(), area.top(), area.width(), 30), title(),
      needle.empty()
          ? QString()
          : QString("%1 needle tokens from token %2").arg(needle.size()).arg(needle.front()));
  QRectF inner = area.adjusted(8, 36, -8, -8);
  if (needle.empty()) return plot::message(p, inner, missing_data());
  std::vector<LegendEntry> legend = {
      legend_line("policy: mass on the needle", QPen(palette::kBlue, 2))};
  if (!compare_name.isEmpty())
    legend.push_back(
        legend_line("compared trace: mass on its needle", QPen(palette::kOrange, 2, Qt::DashLine)));
  if (std::any_of(lost_mass.begin(), lost_mass.end(), [](double x) { return !std::isnan(x); }))
    legend.push_back(legend_line("full cache: mass on keys the policy lost",
                                 QPen(kLostMassColor, 1.5, Qt::DotLine)));
  legend.push_back(legend_line("answer step", QPen(palette::kVermillion, 1.5, Qt::DotLine)));
  // Wide and tall pages: the per-head grid and the loss raster above the mass
  // plot; a small one (a paper column) the mass plot alone, the per-head
  // panels being unreadable there.
  bool panels = inner.width() >= 640 && inner.height() >= 420;
  double lh = legend_height(legend, inner.width() - 8);
  double top_h = panels ? (inner.height() - lh - 10) * 0.55 : 0;
  if (panels) {
    QRectF grid(inner.left() + 56, inner.top(),
                std::min(inner.width() * 0.22, 36.0 * double(kv_heads)), top_h - 44);
    paint_grid(p, grid);
    QRectF losses(grid.right() + 8 + 10 + 60 + 90, inner.top(),
                  std::max(10.0, inner.right() - (grid.right() + 168) - 120), top_h - 44);
    paint_losses(p, losses);
  }
  double y = inner.top() + (panels ? top_h + 6 : 0);
  paint_legend_rows(p, QRectF(inner.left() + 8, y, inner.width() - 8, lh), legend);
  QRectF mass_plot(inner.left() + 56, y + lh + 6, inner.width() - 56 - 16,
                   std::max(10.0, inner.bottom() - (y + lh + 6) - 44));
  paint_mass(p, mass_plot);
}

void NeedleFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n# needle tokens:";
  for (int64_t t : needle) out << ' ' << t;
  out << "\n# compared: " << compare_name << "\n";
  out << "step,policy_needle_mass,compared_needle_mass,oracle_lost_mass\n";
  auto cell = [](const std::vector<double>& v, int64_t s) {
    return s < int64_t(v.size()) && !std::isnan(v[size_t(s)]) ? QString::number(v[size_t(s)])
                                                              : QString();
  };
  for (int64_t s = 0; s < n_steps; ++s)
    out << s << ',' << cell(mass, s) << ',' << cell(compare_mass, s) << ',' << cell(lost_mass, s)
        << '\n';
  out << "layer,kv_head,token,admit_step,evict_step\n";
  const size_t n = needle.size();
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t k = 0; k < kv_heads; ++k)
      for (size_t i = 0; i < n; ++i) {
        size_t at = size_t(l * kv_heads + k) * n + i;
        out << l << ',' << k << ',' << needle[i] << ',' << admit[at] << ',' << evict[at] << '\n';
      }
}

}  // namespace kvscope::views
