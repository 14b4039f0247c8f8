// A Figure is what a view shows, independent of any widget: it paints itself
// (axes, labels, colour bar included) into any QPainter — a widget, a PNG, an
// SVG or a PDF — and writes its data as CSV. Widgets and `kvscope export`
// run the same painting code.
#pragma once

#include <QPainter>
#include <QRectF>
#include <QString>
#include <QTextStream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "views/colormap.h"

namespace kvscope::views {

class Figure {
 public:
  virtual ~Figure() = default;
  virtual QString title() const = 0;
  // Paints the whole figure into `area` (logical pixels, 96 per inch).
  virtual void paint(QPainter& p, const QRectF& area) const = 0;
  virtual void write_csv(QTextStream& out) const = 0;
  // Why the trace cannot show this figure (it lacks the data the view
  // plots: no series, no needle, no pooled attention), or empty. The GUI
  // paints the reason in the figure's place; `kvscope export` refuses with
  // it instead of writing a placeholder.
  virtual QString missing_data() const { return {}; }
};

// Page geometry of an export: `width` x `height` pixels at `dpi`; PDF and
// SVG get the same physical size (width / dpi inches) as vector output.
struct ExportOptions {
  int width = 1600;
  int height = 1000;
  double dpi = 150;
};

// Named page sizes for figures in papers and talks. Text is set at 8 pt on
// the page, so each preset is the physical size the figure is printed or
// shown at:
//   column  3.5 x 2.5 in at 300 dpi (1050 x 750): one column of a two-column paper
//   wide    7 x 3 in at 300 dpi (2100 x 900): the full text width of that paper
//   slide   6.67 x 3.75 in at 288 dpi (1920 x 1080): a 16:9 slide's half width,
//           so 8 pt reads as 16 pt when the figure fills a 13.33 in slide
struct ExportPreset {
  const char* name;
  const char* description;
  ExportOptions options;
};
const std::vector<ExportPreset>& export_presets();
// The preset called `name`; throws InputError naming the field and the choices.
ExportOptions export_preset(const std::string& name);

// Paints `figure` on a page of `options` as every export does: white
// background, logical pixels (96 per inch) scaled to the page's DPI.
void paint_page(const Figure& figure, QPainter& p, const ExportOptions& options);

enum class ExportFormat { Png, Svg, Pdf, Csv };
// From the file name's extension; throws InputError naming the file otherwise.
ExportFormat export_format_for(const QString& path);
// Writes the figure (or its CSV data); throws InputError / std::runtime_error
// with the path on failure. Never leaves a partial file behind.
void export_figure(const Figure& figure, const QString& path, const ExportOptions& options);

// Plot helpers shared by the figures.
namespace plot {

QFont font(double points, bool bold = false);

// Splits a figure area into title, plot and (optional) colour bar regions.
struct Frame {
  QRectF title, plot, colorbar;
};
Frame frame(const QRectF& area, bool with_colorbar, double left_margin = 64,
            double bottom_margin = 44);

// "Nice" tick values covering [lo, hi], about `target` of them.
// With `min_step` >= 1 ticks stay on whole numbers (layers, heads, steps, tokens).
std::vector<double> ticks(double lo, double hi, int target = 6, double min_step = 0);
QString tick_label(double v);

// Axes box, ticks and labels for data ranges x [x0, x1], y [y0, y1] drawn
// into `plot` (y grows downwards when `y_down`).
void axes(QPainter& p, const QRectF& plot, double x0, double x1, double y0, double y1,
          const QString& xlabel, const QString& ylabel, bool y_down = false);
// A strip's axes: the box, x ticks and the x label, no y axis.
void x_axis(QPainter& p, const QRectF& plot, double x0, double x1, const QString& xlabel);
// Axis labels only where the caller draws its own tick texts.
// The y label's baseline sits `ylabel_offset` px left of the plot.
void axis_labels(QPainter& p, const QRectF& plot, const QString& xlabel, const QString& ylabel,
                 double ylabel_offset = 48);
void title(QPainter& p, const QRectF& rect, const QString& text, const QString& subtitle = {});
void colorbar(QPainter& p, const QRectF& rect, const ColorScale& scale, const QString& label);
// A placeholder message centred in `area`.
void message(QPainter& p, const QRectF& area, const QString& text);
// Data <-> pixel mapping of one axis.
struct Map {
  double d0, d1, p0, p1;
  double operator()(double d) const { return p0 + (d - d0) * (p1 - p0) / (d1 - d0); }
  double inverse(double px) const { return d0 + (px - p0) * (d1 - d0) / (p1 - p0); }
};
// Token labels along a token axis zoomed to `px_per_token` >= 9: "index
// text" (elided at the end to `room` px, so the index stays) left of the plot
// for rows (Qt::Vertical) or rotated below it for columns (Qt::Horizontal),
// for tokens [t0, t1) whose centre is in view.
void token_labels(QPainter& p, const QRectF& plot, const Map& map, Qt::Orientation axis, int64_t t0,
                  int64_t t1, const std::vector<QString>* texts, double room, double px_per_token);
// The axis title beyond such labels.
void token_axis_title(QPainter& p, const QRectF& plot, Qt::Orientation axis, double room,
                      const QString& title);

// The largest finite value of the series, at least `floor`.
double finite_max(std::initializer_list<const std::vector<double>*> series, double floor);
// A vertical line across `plot` at x (device coordinates).
void vertical_line(QPainter& p, const QRectF& plot, double x, const QPen& pen);

// A polyline through the finite values (x = index), broken where one is NaN;
// a lone value is a dot.
void series(QPainter& p, const std::vector<double>& v, const Map& mx, const Map& my,
            const QPen& pen);
void legend(QPainter& p, const QPointF& top_left,
            const std::vector<std::pair<QColor, QString>>& items, bool dashed_second = false);

}  // namespace plot

}  // namespace kvscope::views
