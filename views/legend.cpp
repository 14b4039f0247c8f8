#include "views/legend.h"

#include "views/figure.h"

namespace kvscope::views {

LegendEntry legend_line(const QString& text, const QPen& pen) {
  return {text, [pen](QPainter& p, const QRectF& r) {
            p.setPen(pen);
            p.drawLine(QPointF(r.left(), r.center().y()), QPointF(r.right(), r.center().y()));
          }};
}

LegendEntry legend_box(const QString& text, const QColor& color) {
  return {text,
          [color](QPainter& p, const QRectF& r) { p.fillRect(r.adjusted(2, 1, -2, -1), color); }};
}

double legend_height(const std::vector<LegendEntry>& entries, double width) {
  QFontMetricsF fm(plot::font(kLegendPoints));
  return legend_rows(entries, fm, width) * (fm.height() + 3);
}

int legend_rows(const std::vector<LegendEntry>& entries, const QFontMetricsF& fm, double width) {
  int rows = entries.empty() ? 0 : 1;
  double x = 0;
  for (const LegendEntry& e : entries) {
    double w = 24 + fm.horizontalAdvance(e.text) + 16;
    if (x > 0 && x + w > width) ++rows, x = 0;
    x += w;
  }
  return rows;
}

void paint_legend_rows(QPainter& p, const QRectF& rect, const std::vector<LegendEntry>& entries) {
  p.save();
  p.setFont(plot::font(kLegendPoints));
  QFontMetricsF fm(p.font());  // the painter's font: metrics at the device's DPI
  double row_h = fm.height() + 3, x = rect.left(), y = rect.top();
  for (const LegendEntry& e : entries) {
    double w = 24 + fm.horizontalAdvance(e.text) + 16;
    if (x > rect.left() && x + w > rect.right()) x = rect.left(), y += row_h;
    p.save();
    e.draw(p, QRectF(x, y + 1, 18, row_h - 2));
    p.restore();
    p.setPen(Qt::black);
    p.drawText(QPointF(x + 24, y + (row_h + fm.ascent() - fm.descent()) / 2), e.text);
    x += w;
  }
  p.restore();
}

}  // namespace kvscope::views
