#include "views/sweep_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "views/legend.h"

namespace kvscope::views {

namespace {

constexpr double kTitleH = 34, kMargin = 8, kGap = 10, kLegendW = 110;
// Narrower than this, the found/missed key flows in rows under the title and
// the grid takes the whole width (a 110 px key column left a dock at 300 px
// with cells 4 px wide).
constexpr double kLegendColumnMinWidth = 520;

template <typename T>
size_t index_of(const std::vector<T>& v, const T& x) {
  return size_t(std::find(v.begin(), v.end(), x) - v.begin());
}

template <typename T>
void add_unique(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

const QColor kFound = palette::kGreen, kMissed = palette::kVermillion, kFailed = palette::kGrey,
             kNotRun = palette::kLightGrey;

std::vector<LegendEntry> success_legend() {
  return {legend_box("found", kFound), legend_box("missed", kMissed), legend_box("failed", kFailed),
          legend_box("not run", kNotRun)};
}

}  // namespace

SweepFigure::SweepFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric)
    : SweepResultsFigure(std::move(name), std::move(rows), metric) {
  if (metric_ == SweepMetric::Kl)
    throw std::logic_error("the sweep grid colours by success, score or needle survival");
  // Axes in the table's (plan) order; depths and lengths sorted.
  std::vector<std::string> task_of;  // per row: its task, a dataset's rows one
  for (const sweep::ResultRow& r : rows_) {
    add_unique(policies_, r.policy);
    task_of.push_back(sweep::dataset_of(r));
    add_unique(tasks_, task_of.back());
    if (r.tokens) add_unique(lengths_, *r.tokens);
    if (r.depth) add_unique(depths_, *r.depth);
  }
  std::sort(lengths_.begin(), lengths_.end());
  std::sort(depths_.begin(), depths_.end());
  for (size_t i = 0; i < rows_.size(); ++i) {
    const sweep::ResultRow& r = rows_[i];
    if (!r.tokens || !r.depth) continue;
    Cell& c = cells_[{index_of(policies_, r.policy), index_of(tasks_, task_of[i]),
                      index_of(lengths_, *r.tokens), index_of(depths_, *r.depth)}];
    c.rows.push_back(i);
    if (!r.ok()) continue;
    double v = sweep_metric_value(r, metric_);
    // A cell that ran without a success value counts as missed; one without
    // a needle has no survival.
    if (std::isnan(v) && metric_ != SweepMetric::NeedleSurvival) v = 0;
    if (std::isnan(v)) continue;
    c.value = (c.value * c.ran + v) / (c.ran + 1);
    ++c.ran;
  }
}

QString SweepFigure::title() const {
  return QString("Sweep %1: %2").arg(name_, sweep_metric_label(metric_));
}

SweepFigure::Layout SweepFigure::layout(const QRectF& area, QPaintDevice* device) const {
  Layout l;
  // Text is measured on the device it is drawn on (an export's DPI scales
  // fonts given in points).
  const QFontMetricsF fm(plot::font(8), device);
  l.title = QRectF(area.left(), area.top(), area.width(), kTitleH - 4);
  double widest = 0;
  for (const std::string& pol : policies_)
    widest = std::max(widest, fm.horizontalAdvance(sweep_policy_label(pol)));
  // Policy labels take what they need, up to a third of the width (elided beyond).
  l.label_width = std::min(widest + 8, area.width() / 3);
  l.depth_ticks = std::max(fm.horizontalAdvance("0.75"), fm.horizontalAdvance("depth")) + 8;
  l.left = area.left() + kMargin + l.label_width + l.depth_ticks;
  l.header_h = fm.height() + 4;
  l.tick_h = 2 * fm.height() + 8;  // length ticks and the axis title
  l.legend_rows = metric_ == SweepMetric::Success && area.width() < kLegendColumnMinWidth;
  const double key_h =
      l.legend_rows ? legend_height(success_legend(), area.width() - 2 * kMargin) + 4 : 0;
  l.top = area.top() + kTitleH + key_h + l.header_h;
  l.gap = kGap;
  const double right = area.right() - kMargin - (l.legend_rows ? 0 : kLegendW);
  const size_t np = std::max<size_t>(1, policies_.size()), nt = std::max<size_t>(1, tasks_.size());
  l.panel_w = std::max(4.0, (right - l.left - l.gap * double(nt - 1)) / double(nt));
  l.panel_h = std::max(
      4.0, (area.bottom() - kMargin - l.tick_h - l.top - l.gap * double(np - 1)) / double(np));
  l.legend = l.legend_rows ? QRectF(area.left() + kMargin, area.top() + kTitleH,
                                    area.width() - 2 * kMargin, key_h - 4)
                           : QRectF(right + 12, l.top, kLegendW - 12,
                                    std::min(220.0, l.panel_h * double(np)));
  const double cw = l.panel_w / double(std::max<size_t>(1, lengths_.size()));
  const double ch = l.panel_h / double(std::max<size_t>(1, depths_.size()));
  l.values = cw >= fm.horizontalAdvance("0.00") + 6 && ch >= fm.height() + 2;
  return l;
}

QRectF SweepFigure::cell_rect(const Layout& l, size_t policy, size_t task, size_t length,
                              size_t depth) const {
  const double cw = l.panel_w / double(std::max<size_t>(1, lengths_.size()));
  const double ch = l.panel_h / double(std::max<size_t>(1, depths_.size()));
  const double x = l.left + double(task) * (l.panel_w + l.gap) + double(length) * cw;
  const double y = l.top + double(policy) * (l.panel_h + l.gap) + double(depth) * ch;
  return QRectF(x, y, cw, ch);
}

QColor SweepFigure::cell_color(const Cell& c) const {
  if (c.rows.empty()) return kNotRun;
  if (c.ran == 0) return kFailed;
  if (metric_ == SweepMetric::Success) {
    // Seeds that disagree blend between missed and found.
    const double f = c.value;
    return QColor::fromRgbF(kMissed.redF() + f * (kFound.redF() - kMissed.redF()),
                            kMissed.greenF() + f * (kFound.greenF() - kMissed.greenF()),
                            kMissed.blueF() + f * (kFound.blueF() - kMissed.blueF()));
  }
  return QColor(ColorScale{ColorMapId::Viridis, false, 0.f, 1.f}.color(float(c.value)));
}

QString SweepFigure::cell_text(const Cell& c) const {
  if (c.rows.empty() || c.ran == 0) return {};
  if (metric_ == SweepMetric::Success && c.rows.size() == 1) return c.value > 0.5 ? "✓" : "✗";
  return QString::number(c.value, 'f', 2);
}

void SweepFigure::paint_legend(QPainter& p, const Layout& l) const {
  if (metric_ != SweepMetric::Success) {
    plot::colorbar(p, QRectF(l.legend.left(), l.legend.top(), 14, l.legend.height()),
                   ColorScale{ColorMapId::Viridis, false, 0.f, 1.f},
                   metric_ == SweepMetric::Score ? "answer score" : "needle survival");
    p.save();
    p.setFont(plot::font(8));
    QFontMetricsF fm(p.font(), p.device());
    const double y = l.legend.bottom() + 8;
    for (int i = 0; i < 2; ++i) {
      const QColor c = i == 0 ? kFailed : kNotRun;
      p.fillRect(QRectF(l.legend.left(), y + i * (fm.height() + 4), 12, fm.height()), c);
      p.setPen(Qt::black);
      p.drawText(QPointF(l.legend.left() + 18, y + i * (fm.height() + 4) + fm.ascent()),
                 i == 0 ? "failed" : "not run");
    }
    p.restore();
    return;
  }
  if (l.legend_rows) {
    paint_legend_rows(p, l.legend, success_legend());
    return;
  }
  p.save();
  p.setFont(plot::font(8));
  QFontMetricsF fm(p.font(), p.device());
  double y = l.legend.top();
  for (const LegendEntry& e : success_legend()) {
    e.draw(p, QRectF(l.legend.left(), y, 12, fm.height()));
    p.setPen(Qt::black);
    p.drawText(QPointF(l.legend.left() + 18, y + fm.ascent()), e.text);
    y += fm.height() + 4;
  }
  p.restore();
}

void SweepFigure::paint(QPainter& p, const QRectF& area) const {
  if (rows_.empty() || lengths_.empty() || depths_.empty()) {
    plot::message(p, area, "The sweep has no finished cell yet.");
    return;
  }
  const Layout l = layout(area, p.device());
  plot::title(p, l.title, title(), QString("%1 cells").arg(rows_.size()));
  p.save();
  p.setFont(plot::font(8));
  QFontMetricsF fm(p.font(), p.device());
  for (size_t pi = 0; pi < policies_.size(); ++pi) {
    const QRectF first = cell_rect(l, pi, 0, 0, 0);
    const QRectF label(area.left() + kMargin, first.top(), l.label_width - 8, l.panel_h);
    p.setPen(Qt::black);
    p.drawText(label, Qt::AlignRight | Qt::AlignVCenter,
               fm.elidedText(sweep_policy_label(policies_[pi]), Qt::ElideMiddle, label.width()));
    for (size_t ti = 0; ti < tasks_.size(); ++ti) {
      for (size_t li = 0; li < lengths_.size(); ++li)
        for (size_t di = 0; di < depths_.size(); ++di) {
          const QRectF r = cell_rect(l, pi, ti, li, di);
          const auto it = cells_.find({pi, ti, li, di});
          const Cell empty;
          const Cell& c = it == cells_.end() ? empty : it->second;
          p.fillRect(r, cell_color(c));
          p.setPen(QPen(Qt::white, 1));
          p.drawRect(r);
          if (l.values) {
            const QString text = cell_text(c);
            const QColor bg = cell_color(c);
            p.setPen(qGray(bg.rgb()) > 140 ? Qt::black : Qt::white);
            p.drawText(r, Qt::AlignCenter, text);
          }
          bool lit = false;
          for (size_t row : c.rows) lit |= rows_[row].cell_id == highlight_;
          if (lit) {
            p.setPen(QPen(Qt::black, 2.5));
            p.drawRect(r.adjusted(1.5, 1.5, -1.5, -1.5));
          }
        }
      if (pi == 0) {  // task headers
        const QRectF head(l.left + double(ti) * (l.panel_w + l.gap), l.top - l.header_h, l.panel_w,
                          l.header_h - 2);
        p.setPen(Qt::black);
        p.setFont(plot::font(8, true));
        p.drawText(head, Qt::AlignCenter,
                   QFontMetricsF(p.font(), p.device())
                       .elidedText(sweep_task_label(tasks_[ti]), Qt::ElideMiddle, head.width()));
        p.setFont(plot::font(8));
      }
    }
    // Depth ticks left of the first panel, thinned to what fits; none above
    // the panel (a row lower than the text would push the first into the axis
    // title), none on the one before.
    const double ch = l.panel_h / double(depths_.size());
    const size_t every = size_t(std::ceil((fm.height() + 1) / std::max(1.0, ch)));
    p.setPen(Qt::black);
    double free_from = first.top();
    for (size_t di = 0; di < depths_.size(); di += std::max<size_t>(1, every)) {
      const QRectF r = cell_rect(l, pi, 0, 0, di);
      const double y = std::max(r.center().y() - fm.height() / 2, first.top());
      if (y < free_from) continue;
      p.drawText(QRectF(r.left() - l.depth_ticks, y, l.depth_ticks - 4, fm.height()),
                 Qt::AlignRight | Qt::AlignVCenter, QString::number(depths_[di], 'g', 3));
      free_from = y + fm.height();
    }
  }
  // Length ticks under the last row of panels, thinned to what fits.
  const double bottom = l.top + double(policies_.size()) * (l.panel_h + l.gap) - l.gap;
  const double cw = l.panel_w / double(lengths_.size());
  const double widest = fm.horizontalAdvance(QString::number(lengths_.back())) + 6;
  const size_t every = size_t(std::ceil(widest / std::max(1.0, cw)));
  for (size_t ti = 0; ti < tasks_.size(); ++ti) {
    for (size_t li = 0; li < lengths_.size(); li += std::max<size_t>(1, every)) {
      const QRectF r = cell_rect(l, 0, ti, li, 0);
      p.drawText(QRectF(r.center().x() - widest / 2, bottom + 2, widest, fm.height()),
                 Qt::AlignCenter, QString::number(lengths_[li]));
    }
  }
  // One axis title under each panel, or one under them all when a panel is
  // too narrow for it.
  const bool per_panel = fm.horizontalAdvance("tokens") <= l.panel_w;
  for (size_t ti = 0; ti < (per_panel ? tasks_.size() : 1); ++ti) {
    const double width =
        per_panel ? l.panel_w : double(tasks_.size()) * (l.panel_w + l.gap) - l.gap;
    const QRectF axis(l.left + double(ti) * (l.panel_w + l.gap), bottom + fm.height() + 4, width,
                      fm.height());
    p.drawText(axis, Qt::AlignCenter,
               fm.horizontalAdvance("prompt tokens") <= axis.width() ? "prompt tokens" : "tokens");
  }
  // The depth axis title heads its tick column.
  p.drawText(QRectF(l.left - l.depth_ticks, l.top - l.header_h, l.depth_ticks - 4, l.header_h - 2),
             Qt::AlignRight | Qt::AlignVCenter, "depth");
  p.restore();
  paint_legend(p, l);
}

std::vector<const sweep::ResultRow*> SweepFigure::cell_at(const QRectF& area,
                                                          const QPointF& point) const {
  std::vector<const sweep::ResultRow*> out;
  if (rows_.empty() || lengths_.empty() || depths_.empty()) return out;
  const Layout l = layout(area, nullptr);
  for (const auto& [key, cell] : cells_)
    if (cell_rect(l, key[0], key[1], key[2], key[3]).contains(point)) {
      for (size_t row : cell.rows) out.push_back(&rows_[row]);
      break;
    }
  return out;
}

QRectF SweepFigure::cell_area(const QRectF& area, const std::string& cell_id) const {
  if (rows_.empty() || lengths_.empty() || depths_.empty()) return {};
  const Layout l = layout(area, nullptr);
  for (const auto& [key, cell] : cells_)
    for (size_t row : cell.rows)
      if (rows_[row].cell_id == cell_id) return cell_rect(l, key[0], key[1], key[2], key[3]);
  return {};
}

void SweepFigure::write_csv(QTextStream& out) const {
  out << "policy,task,tokens,depth,cells,ran," << sweep_metric_name(metric_) << "\n";
  auto quote = [](const std::string& s) {
    QString q = QString::fromStdString(s);
    return q.contains(',') || q.contains('"') ? "\"" + q.replace("\"", "\"\"") + "\"" : q;
  };
  for (const auto& [key, cell] : cells_) {
    out << quote(policies_[key[0]]) << ',' << quote(tasks_[key[1]]) << ',' << lengths_[key[2]]
        << ',' << depths_[key[3]] << ',' << cell.rows.size() << ',' << cell.ran << ',';
    if (cell.ran > 0) out << cell.value;
    out << "\n";
  }
}

QString SweepFigure::tooltip(const QRectF& area, const QPointF& point) const {
  const std::vector<const sweep::ResultRow*> cells = cell_at(area, point);
  if (cells.empty()) return {};
  const sweep::ResultRow& r = *cells.front();
  return QString("%1\n%2\n%3 tokens, depth %4")
             .arg(QString::fromStdString(r.policy), QString::fromStdString(sweep::dataset_of(r)))
             .arg(r.tokens.value_or(0))
             .arg(r.depth.value_or(0)) +
         describe_cells(cells, 12) + "\n(click: open its trace)";
}

}  // namespace kvscope::views
