#include "views/figure.h"

#include <QFile>
#include <QFileInfo>
#include <QImage>
#include <QPageSize>
#include <QPdfWriter>
#include <QSaveFile>
#include <QSvgGenerator>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/common/input_error.h"

namespace kvscope::views {

ExportFormat export_format_for(const QString& path) {
  QString ext = QFileInfo(path).suffix().toLower();
  if (ext == "png") return ExportFormat::Png;
  if (ext == "svg") return ExportFormat::Svg;
  if (ext == "pdf") return ExportFormat::Pdf;
  if (ext == "csv") return ExportFormat::Csv;
  throw InputError(
      path.toStdString(), "output",
      "unknown extension '." + ext.toStdString() + "' (expected .png, .svg, .pdf or .csv)");
}

// Paints in logical pixels (96 per inch) so text and lines keep their size
// relative to the page at any DPI.
const std::vector<ExportPreset>& export_presets() {
  static const std::vector<ExportPreset> all = {
      {"column", "3.5 x 2.5 in at 300 dpi: one column of a two-column paper", {1050, 750, 300}},
      {"wide", "7 x 3 in at 300 dpi: the text width of a two-column paper", {2100, 900, 300}},
      {"slide",
       "6.67 x 3.75 in at 288 dpi (1920 x 1080 px): a 16:9 slide, text reads 16 pt",
       {1920, 1080, 288}}};
  return all;
}

ExportOptions export_preset(const std::string& name) {
  std::string names;
  for (const ExportPreset& p : export_presets()) {
    if (name == p.name) return p.options;
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  throw InputError("", "--preset", "'" + name + "' is not a preset (" + names + ")");
}

void paint_page(const Figure& figure, QPainter& p, const ExportOptions& o) {
  double scale = o.dpi / 96.0;
  p.setRenderHint(QPainter::Antialiasing);
  p.setRenderHint(QPainter::TextAntialiasing);
  // PDF images deflated, not JPEG'd: JPEG's chroma subsampling bled the
  // colours of a heatmap's or a layer map's small cells into their
  // neighbours (new hues that are on no colour bar).
  p.setRenderHint(QPainter::LosslessImageRendering);
  p.scale(scale, scale);
  QRectF area(0, 0, o.width / scale, o.height / scale);
  p.fillRect(area, Qt::white);
  figure.paint(p, area);
}

namespace {

[[noreturn]] void fail(const QString& path, const QString& what) {
  throw std::runtime_error(path.toStdString() + ": " + what.toStdString());
}

}  // namespace

void export_figure(const Figure& figure, const QString& path, const ExportOptions& o) {
  if (o.width < 16 || o.height < 16 || o.width > 20000 || o.height > 20000)
    throw InputError(path.toStdString(), "size",
                     "width and height must be within 16..20000 pixels");
  if (!(o.dpi >= 10 && o.dpi <= 2400))
    throw InputError(path.toStdString(), "dpi", "must be within 10..2400");
  ExportFormat format = export_format_for(path);
  // Everything goes to a temporary file renamed on success: no half figure
  // is ever left under the requested name.
  QSaveFile out(path);
  if (!out.open(QIODevice::WriteOnly)) fail(path, "cannot open for writing: " + out.errorString());
  if (format == ExportFormat::Csv) {
    QTextStream text(&out);
    figure.write_csv(text);
    text.flush();
  } else if (format == ExportFormat::Png) {
    QImage img(o.width, o.height, QImage::Format_ARGB32);
    img.setDotsPerMeterX(int(std::lround(o.dpi / 0.0254)));
    img.setDotsPerMeterY(int(std::lround(o.dpi / 0.0254)));
    img.fill(Qt::white);
    {
      QPainter p(&img);
      paint_page(figure, p, o);
    }
    if (!img.save(&out, "PNG")) fail(path, "PNG encoding failed");
  } else if (format == ExportFormat::Svg) {
    QSvgGenerator svg;
    svg.setOutputDevice(&out);
    svg.setSize(QSize(o.width, o.height));
    svg.setViewBox(QRect(0, 0, o.width, o.height));
    svg.setResolution(int(std::lround(o.dpi)));
    svg.setTitle(figure.title());
    svg.setDescription("KVScope figure");
    QPainter p(&svg);
    paint_page(figure, p, o);
  } else {
    QPdfWriter pdf(&out);
    pdf.setResolution(int(std::lround(o.dpi)));
    pdf.setPageSize(QPageSize(QSizeF(o.width / o.dpi, o.height / o.dpi), QPageSize::Inch,
                              figure.title(), QPageSize::ExactMatch));
    pdf.setPageMargins(QMarginsF(0, 0, 0, 0));
    pdf.setTitle(figure.title());
    pdf.setCreator("KVScope");
    QPainter p(&pdf);
    paint_page(figure, p, o);
  }
  if (!out.commit()) fail(path, "cannot write: " + out.errorString());
}

namespace plot {

void token_labels(QPainter& p, const QRectF& plot, const Map& map, Qt::Orientation axis, int64_t t0,
                  int64_t t1, const std::vector<QString>* texts, double room, double px_per_token) {
  p.save();
  p.setFont(font(std::clamp(px_per_token * 0.55, 5.0, 8.0)));
  p.setPen(Qt::black);
  const QFontMetricsF fm(p.font());
  const double lo = axis == Qt::Horizontal ? plot.left() : plot.top();
  const double hi = axis == Qt::Horizontal ? plot.right() : plot.bottom();
  for (int64_t t = t0; t < t1; ++t) {
    const double c = map(t + 0.5);
    if (c < lo || c > hi) continue;  // half in view
    const QString text = texts && t < int64_t(texts->size()) ? (*texts)[size_t(t)] : QString();
    const QString label =
        fm.elidedText(QString::number(t) + " " + text.simplified(), Qt::ElideRight, int(room));
    if (axis == Qt::Vertical) {
      p.drawText(QPointF(plot.left() - 4 - fm.horizontalAdvance(label), c + fm.ascent() / 2 - 1),
                 label);
      continue;
    }
    p.save();
    p.translate(c + fm.ascent() / 2 - 1, plot.bottom() + 4);
    p.rotate(90);
    p.drawText(QPointF(0, 0), label);
    p.restore();
  }
  p.restore();
}

void token_axis_title(QPainter& p, const QRectF& plot, Qt::Orientation axis, double room,
                      const QString& title) {
  p.save();
  p.setPen(Qt::black);
  p.setFont(font(9));
  const QFontMetricsF fm(p.font());
  if (axis == Qt::Horizontal) {
    p.drawText(QRectF(plot.left(), plot.bottom() + 6 + room, plot.width(), fm.height() + 2),
               Qt::AlignHCenter | Qt::AlignTop, title);
  } else {
    p.translate(plot.left() - 6 - room, plot.center().y());
    p.rotate(-90);
    p.drawText(QRectF(-plot.height() / 2, -fm.height() - 2, plot.height(), fm.height() + 2),
               Qt::AlignHCenter | Qt::AlignBottom, title);
  }
  p.restore();
}

double finite_max(std::initializer_list<const std::vector<double>*> series, double floor) {
  double hi = floor;
  for (const std::vector<double>* v : series)
    for (double x : *v)
      if (!std::isnan(x)) hi = std::max(hi, x);
  return hi;
}

void vertical_line(QPainter& p, const QRectF& plot, double x, const QPen& pen) {
  p.setPen(pen);
  p.drawLine(QPointF(x, plot.top()), QPointF(x, plot.bottom()));
}

void series(QPainter& p, const std::vector<double>& v, const Map& mx, const Map& my,
            const QPen& pen) {
  p.setPen(pen);
  QPolygonF run;
  auto flush = [&] {
    if (run.size() == 1) p.drawEllipse(run.front(), 2, 2);
    if (run.size() > 1) p.drawPolyline(run);
    run.clear();
  };
  for (size_t s = 0; s < v.size(); ++s) {
    if (std::isnan(v[s])) {
      flush();
      continue;
    }
    run << QPointF(mx(double(s)), my(v[s]));
  }
  flush();
}

QFont font(double points, bool bold) {
  QFont f("DejaVu Sans");
  // Sized in logical pixels (96 per inch), not points: a point size is
  // resolved at the paint device's DPI, and the export painter scales
  // logical pixels to that DPI again, so a PNG at 150 dpi showed text 1.56x
  // larger than the layout measured and a PDF differed from both. In pixels
  // every device shows the text the layout measured.
  f.setPixelSize(std::max(1, int(std::lround(points * 96.0 / 72.0))));
  f.setBold(bold);
  return f;
}

Frame frame(const QRectF& a, bool with_colorbar, double left, double bottom) {
  Frame f;
  f.title = QRectF(a.left(), a.top(), a.width(), 30);
  double right = with_colorbar ? 100 : 16;
  f.plot = QRectF(a.left() + left, a.top() + 34, std::max(10.0, a.width() - left - right),
                  std::max(10.0, a.height() - 34 - bottom));
  if (with_colorbar) f.colorbar = QRectF(f.plot.right() + 14, f.plot.top(), 14, f.plot.height());
  return f;
}

std::vector<double> ticks(double lo, double hi, int target, double min_step) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  double raw = std::max((hi - lo) / std::max(1, target), min_step);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    // Counting axes step by 3 where others step by 2.5: "layer 2.5" names nothing.
    if (min_step >= 1 && m * mag != std::floor(m * mag)) m = std::ceil(m * mag) / mag;
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

QString tick_label(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-3)) return QString::number(v, 'g', 3);
  return QString::number(v, 'g', 6);
}

namespace {

// Counting axes (layers, heads, steps, tokens, entries) tick on whole numbers.
double counting_step(const QString& label) {
  static const QStringList words = {"layer", "head", "step", "token", "entries"};
  for (const QString& w : words)
    if (label.contains(w)) return 1.0;
  return 0.0;
}

void x_ticks(QPainter& p, const QRectF& plot, double x0, double x1, const QString& xlabel) {
  p.setFont(font(8));
  QFontMetricsF fm(p.font());
  Map mx{x0, x1, plot.left(), plot.right()};
  // A label that would touch the previous one is left out (its tick stays).
  double last_right = -1e300;
  for (double v : ticks(x0, x1, std::max(2, int(plot.width() / 90)), counting_step(xlabel))) {
    double x = mx(v);
    if (x < plot.left() - 0.5 || x > plot.right() + 0.5) continue;
    p.drawLine(QPointF(x, plot.bottom()), QPointF(x, plot.bottom() + 4));
    QString s = tick_label(v);
    double left = x - fm.horizontalAdvance(s) / 2;
    if (left < last_right + 4) continue;
    p.drawText(QPointF(left, plot.bottom() + 5 + fm.ascent()), s);
    last_right = left + fm.horizontalAdvance(s);
  }
}

}  // namespace

void x_axis(QPainter& p, const QRectF& plot, double x0, double x1, const QString& xlabel) {
  p.save();
  p.setPen(QPen(Qt::black, 1));
  p.setBrush(Qt::NoBrush);
  p.drawRect(plot);
  x_ticks(p, plot, x0, x1, xlabel);
  p.restore();
  axis_labels(p, plot, xlabel, "");
}

void axes(QPainter& p, const QRectF& plot, double x0, double x1, double y0, double y1,
          const QString& xlabel, const QString& ylabel, bool y_down) {
  p.save();
  p.setPen(QPen(Qt::black, 1));
  p.setBrush(Qt::NoBrush);
  p.drawRect(plot);
  x_ticks(p, plot, x0, x1, xlabel);
  QFontMetricsF fm(p.font());
  Map my{y0, y1, y_down ? plot.top() : plot.bottom(), y_down ? plot.bottom() : plot.top()};
  double widest = 0;
  std::vector<QRectF> drawn;  // y labels so far: one touching another is left out
  for (double v : ticks(y0, y1, std::max(2, int(plot.height() / 60)), counting_step(ylabel))) {
    double y = my(v);
    if (y < plot.top() - 0.5 || y > plot.bottom() + 0.5) continue;
    p.drawLine(QPointF(plot.left() - 4, y), QPointF(plot.left(), y));
    QString s = tick_label(v);
    QPointF at(plot.left() - 6 - fm.horizontalAdvance(s), y + fm.ascent() / 2 - 1);
    QRectF box(at.x(), at.y() - fm.ascent() - 1, fm.horizontalAdvance(s),
               fm.ascent() + fm.descent() + 2);
    if (std::any_of(drawn.begin(), drawn.end(), [&](const QRectF& d) { return d.intersects(box); }))
      continue;
    drawn.push_back(box);
    widest = std::max(widest, fm.horizontalAdvance(s));
    p.drawText(at, s);
  }
  p.restore();
  // Wide tick labels ("0.00075") push the y label out rather than under them.
  axis_labels(p, plot, xlabel, ylabel, std::max(48.0, widest + 14));
}

void axis_labels(QPainter& p, const QRectF& plot, const QString& xlabel, const QString& ylabel,
                 double ylabel_offset) {
  p.save();
  p.setPen(Qt::black);
  p.setFont(font(9));
  QFontMetricsF fm(p.font());
  // Centred on the axis and as wide as the label: a label longer than a
  // narrow plot overhangs it rather than being cut to "/ hea".
  double xw = std::max(plot.width(), fm.horizontalAdvance(xlabel) + 2);
  p.drawText(QRectF(plot.center().x() - xw / 2, plot.bottom() + 20, xw, fm.height() + 2),
             Qt::AlignHCenter | Qt::AlignTop | Qt::TextDontClip, xlabel);
  p.translate(plot.left() - ylabel_offset, plot.center().y());
  p.rotate(-90);
  double yw = std::max(plot.height(), fm.horizontalAdvance(ylabel) + 2);
  p.drawText(QRectF(-yw / 2, -fm.height(), yw, fm.height() + 2),
             Qt::AlignHCenter | Qt::AlignBottom | Qt::TextDontClip, ylabel);
  p.restore();
}

void title(QPainter& p, const QRectF& rect, const QString& text, const QString& subtitle) {
  p.save();
  p.setPen(Qt::black);
  p.setFont(font(10, true));
  QFontMetricsF fm(p.font());
  // Elided in the middle when too long: the end names the head or step.
  QString shown = fm.elidedText(text, Qt::ElideMiddle, rect.width() - 16);
  double w = fm.horizontalAdvance(shown);
  p.drawText(QRectF(rect.left() + 8, rect.top() + 4, rect.width() - 16, rect.height() - 4),
             Qt::AlignLeft | Qt::AlignVCenter, shown);
  if (!subtitle.isEmpty()) {
    p.setFont(font(8));
    p.setPen(QColor(80, 80, 80));
    // Elided to the room left, measured with the painter's font (the device's DPI).
    double room = rect.width() - 28 - w;
    if (room > 40)
      p.drawText(QRectF(rect.left() + 20 + w, rect.top() + 4, room, rect.height() - 4),
                 Qt::AlignLeft | Qt::AlignVCenter,
                 QFontMetricsF(p.font()).elidedText(subtitle, Qt::ElideRight, room));
  }
  p.restore();
}

void colorbar(QPainter& p, const QRectF& r, const ColorScale& scale, const QString& label) {
  if (r.isEmpty()) return;
  p.save();
  const auto& lut = color_map(scale.map);
  QImage bar(1, 256, QImage::Format_RGB32);
  for (int i = 0; i < 256; ++i) bar.setPixel(0, 255 - i, lut[size_t(i)]);
  p.drawImage(r, bar);
  p.setPen(QPen(Qt::black, 1));
  p.drawRect(r);
  p.setFont(font(7));
  QFontMetricsF fm(p.font());
  // A label that would touch the one before is left out (its tick stays):
  // a short bar keeps its labels apart.
  double last_y = 1e300;
  auto at = [&](float pos, const QString& text) {
    double y = r.bottom() - pos * r.height();
    p.drawLine(QPointF(r.right(), y), QPointF(r.right() + 3, y));
    if (std::abs(y - last_y) < fm.ascent() + fm.descent() + 1) return;
    last_y = y;
    p.drawText(QPointF(r.right() + 5, y + fm.ascent() / 2 - 1), text);
  };
  if (scale.log) {
    int a = int(std::ceil(std::log10(std::max(scale.lo, 1e-12f))));
    int b = int(std::floor(std::log10(std::max(scale.hi, 1e-12f))));
    for (int e = a; e <= b; ++e)
      at(scale.position(float(std::pow(10.0, e))), QString("1e%1").arg(e));
  } else {
    for (double v : ticks(scale.lo, scale.hi, 5)) at(scale.position(float(v)), tick_label(v));
  }
  p.setFont(font(8));
  p.translate(r.right() + 42, r.center().y());
  p.rotate(90);
  p.drawText(QRectF(-r.height() / 2, -fm.height(), r.height(), fm.height() + 4), Qt::AlignCenter,
             QFontMetricsF(p.font()).elidedText(label + (scale.log ? " (log)" : ""), Qt::ElideRight,
                                                r.height()));
  p.restore();
}

void message(QPainter& p, const QRectF& area, const QString& text) {
  p.save();
  p.setPen(QColor(90, 90, 90));
  p.setFont(font(10));
  p.drawText(area, Qt::AlignCenter | Qt::TextWordWrap, text);
  p.restore();
}

void legend(QPainter& p, const QPointF& at, const std::vector<std::pair<QColor, QString>>& items,
            bool dashed_second) {
  p.save();
  p.setFont(font(8));
  QFontMetricsF fm(p.font());
  double y = at.y();
  for (size_t i = 0; i < items.size(); ++i) {
    QPen pen(items[i].first, 2.5);
    if (dashed_second && i % 2 == 1) pen.setStyle(Qt::DashLine);
    p.setPen(pen);
    p.drawLine(QPointF(at.x(), y + fm.height() / 2), QPointF(at.x() + 18, y + fm.height() / 2));
    p.setPen(Qt::black);
    p.drawText(QPointF(at.x() + 24, y + fm.ascent()), items[i].second);
    y += fm.height() + 2;
  }
  p.restore();
}

}  // namespace plot

}  // namespace kvscope::views
