#include "views/cutoff_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <map>
#include <utility>

namespace kvscope::views {

namespace {

constexpr int64_t kEventBlock = int64_t(1) << 16;  // events read per hyperslab
constexpr double kLegendFont = 8;

// The head's events with a finite score, in step order. There is no per-head
// index of /events, so this is one pass over the table in bounded blocks; the
// widget reloads only when the head or trace changes, never per step.
std::vector<trace::Event> scored_events(const trace::TraceReader& r, int layer, int kv_head) {
  std::vector<trace::Event> out;
  for (int64_t b = 0, n = r.n_events(); b < n; b += kEventBlock)
    for (const trace::Event& e : r.events(b, std::min(n, b + kEventBlock)))
      if (e.layer == layer && e.kv_head == kv_head && std::isfinite(e.score)) out.push_back(e);
  return out;
}

bool removes(trace::EventKind k) {
  return k == trace::EventKind::Evict || k == trace::EventKind::Reject;
}

// Kept classes in cool colours, removals in warm ones; the marker shape tells
// classes of the same side apart when colours are hard to see.
void style_classes(std::vector<CutoffFigure::DecisionClass>& classes) {
  static const QColor keep[] = {palette::kBlue, palette::kGreen, palette::kSky};
  static const QColor drop[] = {palette::kVermillion, palette::kPurple, palette::kOrange};
  static const int keep_marker[] = {0, 3, 4}, drop_marker[] = {1, 2, 4};
  int nk = 0, nd = 0;
  for (CutoffFigure::DecisionClass& c : classes) {
    int& i = c.removes ? nd : nk;
    c.color = (c.removes ? drop : keep)[i % 3];
    c.marker = (c.removes ? drop_marker : keep_marker)[i % 3];
    ++i;
  }
}

void classify(CutoffFigure& f, const std::vector<trace::Event>& events,
              const std::vector<std::string>& reasons) {
  std::map<std::pair<int, int>, int> index;  // (kind, reason) -> class
  for (const trace::Event& e : events) index[{int(e.kind), int(e.reason)}] = 0;
  for (auto& [key, i] : index) {
    CutoffFigure::DecisionClass c;
    c.kind = trace::EventKind(key.first);
    c.reason = uint16_t(key.second);
    c.removes = removes(c.kind);
    bool named = c.reason < reasons.size() && reasons[c.reason] != "none";
    c.label =
        named ? QString::fromStdString(reasons[c.reason]) : QString(trace::event_kind_name(c.kind));
    f.classes.push_back(c);
  }
  // A reason shared by several kinds (a demote and an evict "outside window")
  // names the kind too.
  std::map<QString, int> uses;
  for (const CutoffFigure::DecisionClass& c : f.classes) ++uses[c.label];
  for (CutoffFigure::DecisionClass& c : f.classes)
    if (uses[c.label] > 1) c.label += QString(" (%1)").arg(trace::event_kind_name(c.kind));
  // Kept before removed, so the legend reads "kept …, evicted …".
  std::stable_sort(f.classes.begin(), f.classes.end(),
                   [](const auto& a, const auto& b) { return a.removes < b.removes; });
  for (size_t i = 0; i < f.classes.size(); ++i)
    index[{int(f.classes[i].kind), int(f.classes[i].reason)}] = int(i);
  for (const trace::Event& e : events) {
    int c = index[{int(e.kind), int(e.reason)}];
    f.decisions.push_back({e.step, e.token, e.score, uint8_t(c)});
    ++f.classes[size_t(c)].count;
  }
  style_classes(f.classes);
}

void fit_range(CutoffFigure& f) {
  float lo = INFINITY, hi = -INFINITY;
  for (float v : f.values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (std::isfinite(lo)) f.value_min = lo, f.value_max = hi;
  for (const CutoffFigure::Decision& d : f.decisions)
    lo = std::min(lo, d.score), hi = std::max(hi, d.score);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  float pad = hi > lo ? (hi - lo) * 0.04f : 0.5f;
  f.lo = lo - pad;
  f.hi = hi + pad;
}

void draw_marker(QPainter& p, const QPointF& c, int marker, double r) {
  switch (marker) {
    case 1:
      p.drawPolygon(QPolygonF(
          {c + QPointF(-r, -r * 0.8), c + QPointF(r, -r * 0.8), c + QPointF(0, r * 1.1)}));
      break;
    case 2:
      p.drawLine(c + QPointF(-r, -r), c + QPointF(r, r));
      p.drawLine(c + QPointF(-r, r), c + QPointF(r, -r));
      break;
    case 3: p.drawRect(QRectF(c.x() - r * 0.85, c.y() - r * 0.85, r * 1.7, r * 1.7)); break;
    case 4:
      p.drawPolygon(QPolygonF({c + QPointF(0, -r * 1.2), c + QPointF(r, 0), c + QPointF(0, r * 1.2),
                               c + QPointF(-r, 0)}));
      break;
    default: p.drawEllipse(c, r, r);
  }
}

// Pen and brush of a class's markers: filled shapes, a cross drawn by its pen.
void marker_style(QPainter& p, const CutoffFigure::DecisionClass& c) {
  QColor fill = c.color;
  fill.setAlpha(170);
  p.setPen(c.marker == 2 ? QPen(c.color, 1.6) : QPen(c.color.darker(130), 0.8));
  p.setBrush(c.marker == 2 ? QBrush(Qt::NoBrush) : QBrush(fill));
}

}  // namespace

std::shared_ptr<CutoffFigure> CutoffFigure::load(TraceData& data, const Selection& sel,
                                                 int series) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<CutoffFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->n_steps = r.n_steps();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
  f->selected_token = sel.token();
  for (const trace::SeriesSpec& s : r.series()) f->series_names << QString::fromStdString(s.name);
  // An index from another trace (the GUI keeps its choice) falls back to the first.
  if (series < 0 || series >= f->series_names.size()) series = 0;
  if (f->series_names.isEmpty() || f->n_steps == 0) return f;
  const trace::SeriesSpec& spec = r.series()[size_t(series)];
  f->series = series;
  f->series_name = QString::fromStdString(spec.name);
  f->meaning = QString::fromStdString(spec.meaning);
  f->units = QString::fromStdString(spec.units);
  f->values = r.series_head(series, f->layer, f->kv_head, 0, f->n_steps);
  classify(*f, scored_events(r, f->layer, f->kv_head), r.run().reason_names);
  fit_range(*f);
  return f;
}

QString CutoffFigure::title() const {
  return QString("Eviction cutoff · %1 · layer %2 · kv head %3")
      .arg(series < 0 ? QString("no series") : series_name)
      .arg(layer)
      .arg(kv_head);
}

std::vector<std::pair<QString, int>> CutoffFigure::legend_entries(bool compact) const {
  // Marker codes: -1 the series line, -2 the current step; >= 0 a class.
  // Compact: the reason up to its colon ("kept", "displaced"), no counts.
  std::vector<std::pair<QString, int>> out = {{series_name, -1},
                                              {QString("step %1").arg(step), -2}};
  for (size_t i = 0; i < classes.size(); ++i)
    out.push_back({compact ? classes[i].label.section(':', 0, 0)
                           : QString("%1 (%2)").arg(classes[i].label).arg(classes[i].count),
                   int(i)});
  return out;
}

namespace {
// Rows a legend of `entries` takes in `width`.
int legend_rows(const std::vector<std::pair<QString, int>>& entries, const QFontMetricsF& fm,
                double width) {
  int rows = 1;
  double x = 0;
  for (const auto& [text, code] : entries) {
    double w = 24 + fm.horizontalAdvance(text) + 18;
    if (x > 0 && x + w > width) ++rows, x = 0;
    x += w;
  }
  return rows;
}
}  // namespace

CutoffFigure::Layout CutoffFigure::layout(const QRectF& area, const QPaintDevice* device) const {
  Layout l;
  l.title = QRectF(area.left(), area.top(), area.width(), 30);
  // The legend flows in rows above the plot, so it never covers data; it
  // takes short labels when the full ones would crowd the plot out.
  QFontMetricsF fm(plot::font(kLegendFont), device);
  double row_h = fm.height() + 3, width = std::max(40.0, area.width() - 24);
  int rows = 0;
  if (series >= 0) {
    rows = legend_rows(legend_entries(false), fm, width);
    l.compact = rows * row_h > 0.2 * area.height();
    if (l.compact) rows = legend_rows(legend_entries(true), fm, width);
  }
  l.legend = QRectF(area.left() + 12, area.top() + 32, width, rows * row_h);
  double top = l.legend.bottom() + (rows > 0 ? 8 : 4);
  // 30 px on the right: the last step's tick label is centred on the edge.
  l.plot = QRectF(area.left() + 70, top, std::max(10.0, area.width() - 70 - 30),
                  std::max(10.0, area.bottom() - top - 48));
  return l;
}

plot::Map CutoffFigure::x_map(const QRectF& plot) const {
  // Each step is a unit cell centred on its index.
  return {-0.5, double(std::max<int64_t>(1, n_steps)) - 0.5, plot.left(), plot.right()};
}

plot::Map CutoffFigure::y_map(const QRectF& plot) const {
  return {double(lo), double(hi), plot.bottom(), plot.top()};
}

CutoffFigure::Marks CutoffFigure::marks(const QRectF& plot, int columns) const {
  Marks m;
  m.points.resize(classes.size());
  m.bins.resize(classes.size());
  plot::Map mx = x_map(plot), my = y_map(plot);
  const int cols = std::max(1, columns);
  const int64_t S = std::max<int64_t>(1, n_steps);
  auto col_of = [&](int64_t s) { return int(std::min<int64_t>(cols - 1, s * cols / S)); };
  auto col_x = [&](int c) { return plot.left() + (c + 0.5) * plot.width() / cols; };
  // The line: one vertex per step, or a min and a max per pixel column.
  if (int64_t(values.size()) <= cols) {
    QPolygonF run;
    for (size_t s = 0; s < values.size(); ++s) {
      if (std::isfinite(values[s])) run << QPointF(mx(double(s)), my(values[s]));
      if ((!std::isfinite(values[s]) || s + 1 == values.size()) && !run.isEmpty())
        m.line.push_back(std::exchange(run, {}));
    }
  } else {
    std::vector<float> cmin(size_t(cols), INFINITY), cmax(size_t(cols), -INFINITY);
    for (size_t s = 0; s < values.size(); ++s)
      if (std::isfinite(values[s])) {
        int c = col_of(int64_t(s));
        cmin[size_t(c)] = std::min(cmin[size_t(c)], values[s]);
        cmax[size_t(c)] = std::max(cmax[size_t(c)], values[s]);
      }
    QPolygonF run;
    for (int c = 0; c <= cols; ++c) {
      if (c < cols && std::isfinite(cmin[size_t(c)])) {
        run << QPointF(col_x(c), my(cmin[size_t(c)])) << QPointF(col_x(c), my(cmax[size_t(c)]));
      } else if (!run.isEmpty()) {
        m.line.push_back(std::exchange(run, {}));
      }
    }
  }
  // The decisions: markers, or per class a min-max segment per pixel column.
  for (size_t k = 0; k < classes.size(); ++k) {
    if (classes[k].count <= cols) continue;
    std::vector<float> cmin(size_t(cols), INFINITY), cmax(size_t(cols), -INFINITY);
    for (const Decision& d : decisions)
      if (d.cls == k) {
        int c = col_of(d.step);
        cmin[size_t(c)] = std::min(cmin[size_t(c)], d.score);
        cmax[size_t(c)] = std::max(cmax[size_t(c)], d.score);
      }
    for (int c = 0; c < cols; ++c)
      if (std::isfinite(cmin[size_t(c)]))
        m.bins[k].push_back(QLineF(col_x(c), my(cmin[size_t(c)]), col_x(c), my(cmax[size_t(c)])));
  }
  for (const Decision& d : decisions)
    if (classes[d.cls].count <= cols) m.points[d.cls].push_back(QPointF(mx(d.step), my(d.score)));
  return m;
}

void CutoffFigure::paint_data(QPainter& p, const QRectF& plot, int columns) const {
  Marks m = marks(plot, columns);
  p.save();
  p.setClipRect(plot.adjusted(-4, -4, 4, 4));
  plot::Map mx = x_map(plot);
  p.setPen(QPen(QColor(120, 120, 120), 1, Qt::DashLine));
  p.drawLine(QPointF(mx(double(step)), plot.top()), QPointF(mx(double(step)), plot.bottom()));
  // Removals first, so kept points and the line stay visible on top.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t k = 0; k < classes.size(); ++k) {
      if (classes[k].removes != (pass == 0)) continue;
      // One device pixel column per bin: a cosmetic pen keeps them apart.
      QPen bin_pen(classes[k].color, 2, Qt::SolidLine, Qt::SquareCap);
      bin_pen.setCosmetic(true);
      p.setPen(bin_pen);
      for (const QLineF& b : m.bins[k]) p.drawLine(b);
      marker_style(p, classes[k]);
      for (const QPointF& pt : m.points[k]) draw_marker(p, pt, classes[k].marker, 3);
    }
  if (selected_token >= 0) {
    plot::Map my = y_map(plot);
    p.setPen(QPen(Qt::black, 1.2));
    p.setBrush(Qt::NoBrush);
    for (const Decision& d : decisions)
      if (d.token == selected_token) p.drawEllipse(QPointF(mx(d.step), my(d.score)), 6, 6);
  }
  p.setPen(QPen(Qt::black, 1.6));
  p.setBrush(Qt::black);
  for (const QPolygonF& run : m.line)
    run.size() == 1 ? p.drawEllipse(run.front(), 1.4, 1.4) : p.drawPolyline(run);
  p.restore();
}

void CutoffFigure::paint_legend(QPainter& p, const Layout& l) const {
  p.save();
  p.setFont(plot::font(kLegendFont));
  QFontMetricsF fm(p.font());  // the painter's font: metrics at the device's DPI
  const QRectF& rect = l.legend;
  double row_h = fm.height() + 3, x = rect.left(), y = rect.top();
  for (const auto& [text, code] : legend_entries(l.compact)) {
    double w = 24 + fm.horizontalAdvance(text) + 18;
    if (x > rect.left() && x + w > rect.right()) x = rect.left(), y += row_h;
    QPointF mid(x + 9, y + row_h / 2);
    if (code == -1) {
      p.setPen(QPen(Qt::black, 1.6));
      p.drawLine(mid - QPointF(9, 0), mid + QPointF(9, 0));
    } else if (code == -2) {
      p.setPen(QPen(QColor(120, 120, 120), 1, Qt::DashLine));
      p.drawLine(mid - QPointF(0, row_h / 2 - 1), mid + QPointF(0, row_h / 2 - 1));
    } else {
      marker_style(p, classes[size_t(code)]);
      draw_marker(p, mid, classes[size_t(code)].marker, 3.5);
    }
    p.setPen(Qt::black);
    p.drawText(QPointF(x + 24, y + (row_h + fm.ascent() - fm.descent()) / 2), text);
    x += w;
  }
  p.restore();
}

QString CutoffFigure::fitted_title(const QFontMetricsF& fm, double width) const {
  QString name = series < 0 ? QString("no series") : series_name;
  if (fm.horizontalAdvance(title()) <= width) return title();
  for (const char* t : {"Cutoff · %1 · layer %2 · kv head %3", "%1 · L%2 · kv %3"}) {
    QString s = QString(t).arg(name).arg(layer).arg(kv_head);
    if (fm.horizontalAdvance(s) <= width) return s;
  }
  return fm.elidedText(QString("%1 · L%2 · kv %3").arg(name).arg(layer).arg(kv_head),
                       Qt::ElideMiddle, width);
}

QString CutoffFigure::missing_data() const {
  if (series < 0)
    return n_steps == 0 ? QString()
                        : "This trace records no per-step series (/series), so there is no cutoff "
                          "to plot. Policies that record one (e.g. kvpop: kvpop_cutoff) show it "
                          "here.";
  if (!std::isfinite(value_min) && decisions.empty())
    return QString(
               "%1 has no value for layer %2, kv head %3 (NaN at every step) and the head made "
               "no scored decision")
        .arg(series_name)
        .arg(layer)
        .arg(kv_head);
  return {};
}

void CutoffFigure::paint(QPainter& p, const QRectF& area) const {
  Layout l = layout(area, p.device());
  QFontMetricsF title_fm(plot::font(10, true), p.device());
  plot::title(p, l.title, fitted_title(title_fm, area.width() - 16), meaning);
  QRectF below = area.adjusted(16, 36, -16, -16);
  if (const QString why = missing_data(); !why.isEmpty()) return plot::message(p, below, why);
  if (series < 0) return plot::message(p, below, "no steps yet");
  double scale = std::max(1.0, p.worldTransform().m11());
  paint_data(p, l.plot, std::max(1, int(l.plot.width() * scale)));
  QString ylabel = units.isEmpty() || units == "1" ? "score" : "score (" + units + ")";
  QFontMetricsF label_fm(plot::font(9), p.device());
  plot::axes(p, l.plot, -0.5, double(std::max<int64_t>(1, n_steps)) - 0.5, lo, hi, "step",
             label_fm.elidedText(ylabel, Qt::ElideRight, l.plot.height() * 0.95));
  paint_legend(p, l);
}

int64_t CutoffFigure::decision_at(const QRectF& area, const QPointF& point, double radius) const {
  QRectF plot = layout(area).plot;
  plot::Map mx = x_map(plot), my = y_map(plot);
  int64_t best = -1;
  double best_d = radius * radius;
  for (size_t i = 0; i < decisions.size(); ++i) {
    QPointF d = QPointF(mx(decisions[i].step), my(decisions[i].score)) - point;
    double d2 = QPointF::dotProduct(d, d);
    if (d2 <= best_d) best_d = d2, best = int64_t(i);
  }
  return best;
}

void CutoffFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "row,step,token,score,decision\n";
  for (size_t s = 0; s < values.size(); ++s)
    out << "series," << s << ",," << values[s] << ',' << series_name << '\n';
  for (const Decision& d : decisions) {
    QString label = classes[d.cls].label;
    label.replace('"', "\"\"");
    out << "decision," << d.step << ',' << d.token << ',' << d.score << ",\"" << label << "\"\n";
  }
}

}  // namespace kvscope::views
