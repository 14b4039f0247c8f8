// A legend that flows in rows above (or beside) a plot, so it never covers
// data: each entry a swatch drawn by the figure and its text. Figures reserve
// legend_height() for it before they lay out their plots.
#pragma once

#include <QColor>
#include <QFontMetricsF>
#include <QPainter>
#include <QPen>
#include <QString>
#include <functional>
#include <vector>

namespace kvscope::views {

constexpr double kLegendPoints = 8;

struct LegendEntry {
  QString text;
  std::function<void(QPainter&, const QRectF& swatch)> draw;
};
// A swatch of a line in `pen` / a filled box of `color`.
LegendEntry legend_line(const QString& text, const QPen& pen);
LegendEntry legend_box(const QString& text, const QColor& color);

int legend_rows(const std::vector<LegendEntry>& entries, const QFontMetricsF& fm, double width);
// Height of the rows `entries` take in `width` at the legend font.
double legend_height(const std::vector<LegendEntry>& entries, double width);
void paint_legend_rows(QPainter& p, const QRectF& rect, const std::vector<LegendEntry>& entries);

}  // namespace kvscope::views
