#include "views/pareto_figure.h"

#include <QFontMetricsF>
#include <QPainterPath>
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>

namespace kvscope::views {

namespace {

constexpr double kTitleH = 34, kMargin = 8, kPanelGap = 14, kPlotLeft = 58, kPlotBottom = 44,
                 kPlotRight = 10, kPanelWidth = 240, kPanelHeight = 150, kPickRadius = 9,
                 kMarkerRadius = 3.5;

// The Okabe-Ito colours that read on white (yellow does not); `full` is black.
const QColor kLineColors[] = {palette::kBlue,       palette::kOrange, palette::kGreen,
                              palette::kVermillion, palette::kPurple, palette::kSky};
constexpr size_t kNColors = sizeof(kLineColors) / sizeof(kLineColors[0]);

bool is_full(const std::string& line) {
  return line == "full" || (line.size() > 7 && line.compare(line.size() - 7, 7, " · full") == 0);
}

std::string file_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

template <typename T>
size_t add_unique(std::vector<T>& v, const T& x) {
  const auto it = std::find(v.begin(), v.end(), x);
  if (it != v.end()) return size_t(it - v.begin());
  v.push_back(x);
  return v.size() - 1;
}

// Wilson's score interval for k of n at 95 %.
std::pair<double, double> wilson(double k, double n) {
  const double z = 1.959964, p = k / n, z2n = z * z / n;
  const double centre = (p + z2n / 2) / (1 + z2n);
  const double half = z / (1 + z2n) * std::sqrt(p * (1 - p) / n + z2n / (4 * n));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

// Missed cells first (the ones `why` explains), then the others that ran,
// failed ones last; table order within each.
int open_order(const sweep::ResultRow& r) {
  if (!r.ok()) return 2;
  return r.success.value_or(1) == 0 ? 0 : 1;
}

// A marker of shape `shape` (0 circle, 1 square, 2 triangle, 3 diamond).
void marker(QPainter& p, const QPointF& c, int shape, double r) {
  switch (shape % 4) {
    case 0: p.drawEllipse(c, r, r); break;
    case 1: p.drawRect(QRectF(c.x() - r, c.y() - r, 2 * r, 2 * r)); break;
    case 2:
      p.drawPolygon(QPolygonF({QPointF(c.x(), c.y() - 1.2 * r), QPointF(c.x() + 1.1 * r, c.y() + r),
                               QPointF(c.x() - 1.1 * r, c.y() + r)}));
      break;
    default:
      p.drawPolygon(QPolygonF({QPointF(c.x(), c.y() - 1.3 * r), QPointF(c.x() + 1.3 * r, c.y()),
                               QPointF(c.x(), c.y() + 1.3 * r), QPointF(c.x() - 1.3 * r, c.y())}));
  }
}

QString budget_text(const std::optional<double>& b) {
  if (!b) return "no budget";
  return *b <= 1 ? QString("budget %1 of the prompt").arg(*b)
                 : QString("budget %1 entries").arg(int64_t(*b));
}

}  // namespace

ParetoFigure::ParetoFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric)
    : SweepResultsFigure(std::move(name), std::move(rows), metric) {
  struct Sums {
    Point pt;
    double sum = 0, sumsq = 0, kv_sum = 0;
    int kv_n = 0;
    bool binary = true;  // every value 0 or 1: the point is a share of cells
  };
  // (task, line, has budget, budget) -> sums; std::map keeps that order.
  std::map<std::tuple<size_t, size_t, bool, double>, Sums> groups;
  std::vector<std::string> models;
  for (const sweep::ResultRow& r : rows_) add_unique(models, r.model);
  for (size_t i = 0; i < rows_.size(); ++i) {
    const sweep::ResultRow& r = rows_[i];
    // A line per policy, per model and policy when the sweep has several.
    const std::string line_name =
        models.size() > 1 ? file_name(r.model) + " · " + sweep::press_of(r) : sweep::press_of(r);
    const size_t task = add_unique(tasks_, sweep::dataset_of(r)),
                 line = add_unique(lines_, line_name);
    Sums& g = groups[{task, line, r.budget.has_value(), r.budget.value_or(0)}];
    g.pt.task = task, g.pt.line = line, g.pt.budget = r.budget;
    g.pt.rows.push_back(i);
    if (!r.ok()) continue;
    const double v = sweep_metric_value(r, metric_);
    if (!std::isfinite(v) || !r.kv_bytes_mean) continue;
    g.sum += v, g.sumsq += v * v, ++g.pt.ran;
    g.binary = g.binary && (v == 0 || v == 1);
    g.kv_sum += *r.kv_bytes_mean, ++g.kv_n;
    g.pt.kv_peak = std::max(g.pt.kv_peak, double(r.kv_bytes_peak.value_or(0)));
  }
  const bool bounded = metric_ != SweepMetric::Kl;
  for (auto& [key, g] : groups) {
    Point& pt = g.pt;
    std::stable_sort(pt.rows.begin(), pt.rows.end(), [&](size_t a, size_t b) {
      return open_order(rows_[a]) < open_order(rows_[b]);
    });
    if (pt.ran == 0) continue;
    const double n = pt.ran;
    pt.kv_bytes = g.kv_sum / g.kv_n;
    pt.value = g.sum / n;
    if (g.binary && metric_ != SweepMetric::Kl) {
      std::tie(pt.lo, pt.hi) = wilson(g.sum, n);
    } else {
      const double var = n > 1 ? std::max(0.0, (g.sumsq - n * pt.value * pt.value) / (n - 1)) : 0;
      const double half = 1.959964 * std::sqrt(var / n);
      pt.lo = std::max(0.0, pt.value - half);
      pt.hi = bounded ? std::min(1.0, pt.value + half) : pt.value + half;
    }
    points_.push_back(std::move(pt));
  }
  fit_axes();
}

QString ParetoFigure::title() const {
  return QString("Sweep %1: %2 against KV memory").arg(name_, sweep_metric_label(metric_));
}

QString ParetoFigure::missing_data() const {
  if (!points_.empty()) return {};
  bool any_bytes = false;
  for (const sweep::ResultRow& r : rows_) any_bytes |= r.ok() && r.kv_bytes_mean.has_value();
  if (!any_bytes)
    return "no cell that ran records the KV bytes it held (kv_bytes_mean: tables written "
           "before that column have none)";
  return QString("no cell that ran records %1%2")
      .arg(sweep_metric_label(metric_),
           metric_ == SweepMetric::NeedleSurvival ? " (a task with a needle)"
           : metric_ == SweepMetric::Kl           ? " (max_kl: the sweep's oracle)"
                                                  : "");
}

void ParetoFigure::fit_axes() {
  // Each task's bytes in the unit that keeps its largest value under 1024.
  axes_.assign(tasks_.size(), TaskAxis{});
  for (size_t t = 0; t < tasks_.size(); ++t) {
    double top = 0;
    for (const Point& pt : points_)
      if (pt.task == t) top = std::max(top, pt.kv_bytes);
    TaskAxis& a = axes_[t];
    const char* names[] = {"bytes", "KiB", "MiB", "GiB"};
    for (int k = 0; k < 3 && top / a.unit >= 1024; ++k) a.unit *= 1024, a.unit_name = names[k + 1];
    a.x_max = std::max(top, 1.0) * 1.08 / a.unit;
  }
  y_max_ = 1.04;
  if (metric_ == SweepMetric::Kl) {
    double top = 0;
    for (const Point& pt : points_) top = std::max(top, pt.hi);
    y_max_ = top > 0 ? top * 1.1 : 1.0;
  }
}

size_t ParetoFigure::line_style(size_t line) const {
  size_t k = 0;  // styles in line order, skipping full
  for (size_t i = 0; i < line; ++i) k += !is_full(lines_[i]);
  return k;
}

QColor ParetoFigure::line_color(size_t line) const {
  return is_full(lines_[line]) ? QColor(Qt::black) : kLineColors[line_style(line) % kNColors];
}

int ParetoFigure::line_marker(size_t line) const {
  // Shapes cycle apart from colours, so points of lines that coincide (equal
  // budgets hold equal bytes) still show, and 12 lines differ in both.
  return is_full(lines_[line]) ? 0 : int(line_style(line) % 4);
}

std::vector<LegendEntry> ParetoFigure::legend_entries() const {
  std::vector<LegendEntry> entries;
  for (size_t i = 0; i < lines_.size(); ++i)
    entries.push_back({sweep_policy_label(lines_[i]), [this, i](QPainter& p, const QRectF& r) {
                         const QColor c = line_color(i);
                         p.setRenderHint(QPainter::Antialiasing);
                         p.setPen(QPen(c, 2, is_full(lines_[i]) ? Qt::DashLine : Qt::SolidLine));
                         p.drawLine(QPointF(r.left(), r.center().y()),
                                    QPointF(r.right(), r.center().y()));
                         p.setPen(QPen(Qt::white, 1));
                         p.setBrush(c);
                         marker(p, r.center(), line_marker(i), kMarkerRadius);
                       }});
  return entries;
}

ParetoFigure::Layout ParetoFigure::layout(const QRectF& area, QPaintDevice* device) const {
  Layout l;
  l.title = QRectF(area.left(), area.top(), area.width(), kTitleH - 4);
  const double legend_w = area.width() - 2 * kMargin;
  const double legend_h = legend_height(legend_entries(), legend_w);
  l.legend = QRectF(area.left() + kMargin, area.top() + kTitleH, legend_w, legend_h);
  const QFontMetricsF fm(plot::font(8, true), device);
  const size_t n = std::max<size_t>(1, tasks_.size());
  const double top = l.legend.bottom() + 6, header_h = fm.height() + 4;
  // The columns that give the smallest panel the most room for its plot,
  // measured against the plot size a panel reads at.
  size_t cols = 1;
  double best = -1;
  for (size_t c = 1; c <= n; ++c) {
    const size_t r = (n + c - 1) / c;
    const double w = (area.width() - 2 * kMargin) / double(c) - kPlotLeft - kPlotRight;
    const double h = (area.bottom() - kMargin - top) / double(r) - header_h - kPlotBottom;
    const double room = std::min(w / kPanelWidth, h / kPanelHeight);
    if (room > best + 1e-9) best = room, cols = c;
  }
  const size_t rows = (n + cols - 1) / cols;
  const double cell_w = (area.width() - 2 * kMargin) / double(cols);
  const double cell_h = (area.bottom() - kMargin - top) / double(rows);
  for (size_t t = 0; t < n; ++t) {
    const double x = area.left() + kMargin + double(t % cols) * cell_w;
    const double y = top + double(t / cols) * cell_h;
    Panel pn;
    pn.header = QRectF(x + kPlotLeft, y, std::max(4.0, cell_w - kPlotLeft - kPlotRight), header_h);
    pn.plot = QRectF(x + kPlotLeft, y + header_h,
                     std::max(10.0, cell_w - kPlotLeft - kPlotRight - (cols > 1 ? kPanelGap : 0)),
                     std::max(10.0, cell_h - header_h - kPlotBottom));
    l.panels.push_back(pn);
  }
  return l;
}

QPointF ParetoFigure::position(const Layout& l, const Point& pt) const {
  const QRectF& plot = l.panels[pt.task].plot;
  const TaskAxis& a = axes_[pt.task];
  const plot::Map mx{0, a.x_max, plot.left(), plot.right()};
  const plot::Map my{0, y_max_, plot.bottom(), plot.top()};
  return QPointF(mx(pt.kv_bytes / a.unit), my(pt.value));
}

void ParetoFigure::paint_panel(QPainter& p, const Layout& l, size_t task) const {
  const Panel& pn = l.panels[task];
  p.save();
  p.setPen(Qt::black);
  p.setFont(plot::font(8, true));
  p.drawText(pn.header, Qt::AlignCenter,
             QFontMetricsF(p.font(), p.device())
                 .elidedText(sweep_task_label(tasks_[task]), Qt::ElideMiddle, pn.header.width()));
  p.restore();

  // The y title runs along the plot's height: a short panel takes the
  // metric's short name, elided if even that is longer.
  const QFontMetricsF title_fm(plot::font(9), p.device());
  QString ylabel = metric_ == SweepMetric::Kl ? "max KL" : sweep_metric_label(metric_);
  if (title_fm.horizontalAdvance(ylabel) > pn.plot.height()) ylabel = sweep_metric_name(metric_);
  ylabel = title_fm.elidedText(ylabel, Qt::ElideRight, pn.plot.height());
  const TaskAxis& axis = axes_[task];
  QString xlabel = "KV cache held, " + axis.unit_name + " (mean over decode steps)";
  if (title_fm.horizontalAdvance(xlabel) > pn.plot.width()) xlabel = "KV held, " + axis.unit_name;
  xlabel = title_fm.elidedText(xlabel, Qt::ElideRight, pn.plot.width());
  plot::axes(p, pn.plot, 0, axis.x_max, 0, y_max_, xlabel, ylabel);
  const plot::Map my{0, y_max_, pn.plot.bottom(), pn.plot.top()};
  p.save();
  p.setClipRect(pn.plot.adjusted(-kMarkerRadius - 2, -kMarkerRadius - 2, kMarkerRadius + 2, 0));
  for (size_t line = 0; line < lines_.size(); ++line) {
    std::vector<const Point*> pts;
    for (const Point& pt : points_)
      if (pt.task == task && pt.line == line) pts.push_back(&pt);
    if (pts.empty()) continue;
    std::sort(pts.begin(), pts.end(),
              [](const Point* a, const Point* b) { return a->kv_bytes < b->kv_bytes; });
    const QColor color = line_color(line);
    if (is_full(lines_[line]))  // the score all memory buys, across the panel
      for (const Point* pt : pts) {
        p.setPen(QPen(color, 1, Qt::DashLine));
        p.drawLine(QPointF(pn.plot.left(), my(pt->value)), QPointF(pn.plot.right(), my(pt->value)));
      }
    QColor band = color;
    band.setAlpha(45);
    if (pts.size() > 1) {
      QPolygonF poly;
      for (const Point* pt : pts) poly << QPointF(position(l, *pt).x(), my(pt->hi));
      for (auto it = pts.rbegin(); it != pts.rend(); ++it)
        poly << QPointF(position(l, **it).x(), my((*it)->lo));
      p.setPen(Qt::NoPen);
      p.setBrush(band);
      p.drawPolygon(poly);
      QPolygonF path;
      for (const Point* pt : pts) path << position(l, *pt);
      p.setPen(QPen(color, 1.6));
      p.setBrush(Qt::NoBrush);
      p.drawPolyline(path);
    } else {  // one point: its interval as a bar
      const QPointF c = position(l, *pts.front());
      p.setPen(QPen(color, 1.2));
      p.drawLine(QPointF(c.x(), my(pts.front()->lo)), QPointF(c.x(), my(pts.front()->hi)));
      p.drawLine(QPointF(c.x() - 3, my(pts.front()->lo)), QPointF(c.x() + 3, my(pts.front()->lo)));
      p.drawLine(QPointF(c.x() - 3, my(pts.front()->hi)), QPointF(c.x() + 3, my(pts.front()->hi)));
    }
    for (const Point* pt : pts) {
      const QPointF c = position(l, *pt);
      p.setPen(QPen(Qt::white, 1));
      p.setBrush(color);
      marker(p, c, line_marker(line), kMarkerRadius);
      bool lit = false;
      for (size_t row : pt->rows) lit |= rows_[row].cell_id == highlight_;
      if (lit) {
        p.setPen(QPen(Qt::black, 2));
        p.setBrush(Qt::NoBrush);
        p.drawEllipse(c, kMarkerRadius + 3, kMarkerRadius + 3);
      }
    }
  }
  p.restore();
}

void ParetoFigure::paint(QPainter& p, const QRectF& area) const {
  if (const QString why = missing_data(); !why.isEmpty()) {
    plot::message(p, area, "The memory curve cannot be drawn: " + why + ".");
    return;
  }
  const Layout l = layout(area, p.device());
  plot::title(p, l.title, title(), "95 % bands: Wilson's (0/1 cells) or ±1.96 SE");
  paint_legend_rows(p, l.legend, legend_entries());
  for (size_t t = 0; t < tasks_.size(); ++t) paint_panel(p, l, t);
}

const ParetoFigure::Point* ParetoFigure::point_at(const Layout& l, const QPointF& at) const {
  const Point* best = nullptr;
  double best_d = kPickRadius * kPickRadius;
  for (const Point& pt : points_) {
    const QPointF d = position(l, pt) - at;
    const double d2 = d.x() * d.x() + d.y() * d.y();
    if (d2 < best_d || (!best && d2 == best_d)) best = &pt, best_d = d2;
  }
  return best;
}

std::vector<const sweep::ResultRow*> ParetoFigure::cell_at(const QRectF& area,
                                                           const QPointF& point) const {
  std::vector<const sweep::ResultRow*> out;
  if (points_.empty()) return out;
  if (const Point* pt = point_at(layout(area, nullptr), point))
    for (size_t row : pt->rows) out.push_back(&rows_[row]);
  return out;
}

QRectF ParetoFigure::cell_area(const QRectF& area, const std::string& cell_id) const {
  if (points_.empty()) return {};
  const Layout l = layout(area, nullptr);
  for (const Point& pt : points_)
    for (size_t row : pt.rows)
      if (rows_[row].cell_id == cell_id) {
        const QPointF c = position(l, pt);
        return QRectF(c.x() - kMarkerRadius, c.y() - kMarkerRadius, 2 * kMarkerRadius,
                      2 * kMarkerRadius);
      }
  return {};
}

QString ParetoFigure::tooltip(const QRectF& area, const QPointF& point) const {
  if (points_.empty()) return {};
  const Layout l = layout(area, nullptr);
  const Point* pt = point_at(l, point);
  if (!pt) return {};
  std::vector<const sweep::ResultRow*> cells;
  for (size_t row : pt->rows) cells.push_back(&rows_[row]);
  const double u = axes_[pt->task].unit;
  return QString("%1, %2\n%3\n%4 %5 [%6, %7] over %8 of %9 cells\nKV held %10 %11 (peak %12)")
             .arg(QString::fromStdString(lines_[pt->line]), budget_text(pt->budget),
                  QString::fromStdString(tasks_[pt->task]), sweep_metric_label(metric_))
             .arg(pt->value, 0, 'g', 3)
             .arg(pt->lo, 0, 'g', 3)
             .arg(pt->hi, 0, 'g', 3)
             .arg(pt->ran)
             .arg(pt->rows.size())
             .arg(pt->kv_bytes / u, 0, 'g', 4)
             .arg(axes_[pt->task].unit_name)
             .arg(pt->kv_peak / u, 0, 'g', 4) +
         hidden_behind(l, *pt) + describe_cells(cells, 8) +
         "\n(click: open the first cell's trace)";
}

QString ParetoFigure::hidden_behind(const Layout& l, const Point& shown) const {
  const QPointF at = position(l, shown);
  QString out;
  for (const Point& pt : points_) {
    const QPointF d = position(l, pt) - at;
    if (&pt != &shown && pt.task == shown.task && std::abs(d.x()) < 1 && std::abs(d.y()) < 1)
      out += QString("\nalso here: %1, %2")
                 .arg(QString::fromStdString(lines_[pt.line]), budget_text(pt.budget));
  }
  return out;
}

void ParetoFigure::write_csv(QTextStream& out) const {
  out << "task,policy,budget,cells,ran,kv_bytes_mean,kv_bytes_peak," << sweep_metric_name(metric_)
      << ",lo,hi\n";
  auto quote = [](const std::string& s) {
    QString q = QString::fromStdString(s);
    return q.contains(',') || q.contains('"') ? "\"" + q.replace("\"", "\"\"") + "\"" : q;
  };
  for (const Point& pt : points_) {
    out << quote(tasks_[pt.task]) << ',' << quote(lines_[pt.line]) << ',';
    if (pt.budget) out << *pt.budget;
    out << ',' << pt.rows.size() << ',' << pt.ran << ',' << QString::number(pt.kv_bytes, 'g', 12)
        << ',' << QString::number(pt.kv_peak, 'g', 12) << ',' << QString::number(pt.value, 'g', 12)
        << ',' << QString::number(pt.lo, 'g', 12) << ',' << QString::number(pt.hi, 'g', 12) << "\n";
  }
}

}  // namespace kvscope::views
