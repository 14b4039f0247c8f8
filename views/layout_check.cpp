#include "views/layout_check.h"

#include <QFontMetricsF>
#include <QPaintDevice>
#include <QPaintEngine>
#include <QPainter>
#include <QTextItem>
#include <algorithm>
#include <cmath>

namespace kvscope::views {

namespace {

// A paint engine that draws nothing and remembers every text item: its
// rectangle in page coordinates and whether the painter's clip cuts it.
class TextRecordingEngine : public QPaintEngine {
 public:
  TextRecordingEngine() : QPaintEngine(QPaintEngine::AllFeatures) {}
  bool begin(QPaintDevice*) override { return true; }
  bool end() override { return true; }
  Type type() const override { return QPaintEngine::User; }
  void updateState(const QPaintEngineState& s) override {
    if (s.state() & QPaintEngine::DirtyTransform) transform_ = s.transform();
  }
  void drawPixmap(const QRectF&, const QPixmap&, const QRectF&) override {}
  void drawImage(const QRectF&, const QImage&, const QRectF&, Qt::ImageConversionFlags) override {}
  void drawTiledPixmap(const QRectF&, const QPixmap&, const QPointF&) override {}
  void drawPath(const QPainterPath&) override {}
  void drawPolygon(const QPointF*, int, PolygonDrawMode) override {}
  void drawPolygon(const QPoint*, int, PolygonDrawMode) override {}
  void drawLines(const QLineF*, int) override {}
  void drawRects(const QRectF*, int) override {}
  void drawEllipse(const QRectF&) override {}
  void drawPoints(const QPointF*, int) override {}

  void drawTextItem(const QPointF& at, const QTextItem& item) override {
    QString text = item.text();
    if (text.trimmed().isEmpty()) return;
    QFontMetricsF fm(item.font());
    QRectF logical(at.x(), at.y() - fm.ascent(), fm.horizontalAdvance(text),
                   fm.ascent() + fm.descent());
    DrawnText t;
    t.text = text;
    t.rect = transform_.mapRect(logical);
    t.elided = text.contains(QChar(0x2026));
    if (QPainter* p = painter(); p && p->hasClipping()) {
      QRectF clip = p->clipBoundingRect().adjusted(-0.5, -0.5, 0.5, 0.5);
      t.clipped = !clip.contains(logical);
    }
    texts.push_back(t);
  }

  std::vector<DrawnText> texts;

 private:
  QTransform transform_;
};

class TextRecordingDevice : public QPaintDevice {
 public:
  TextRecordingDevice(int width, int height, double dpi)
      : width_(width), height_(height), dpi_(dpi) {}
  QPaintEngine* paintEngine() const override { return &engine_; }
  TextRecordingEngine& engine() { return engine_; }

 protected:
  int metric(PaintDeviceMetric m) const override {
    switch (m) {
      case PdmWidth: return width_;
      case PdmHeight: return height_;
      case PdmWidthMM: return int(std::lround(width_ / dpi_ * 25.4));
      case PdmHeightMM: return int(std::lround(height_ / dpi_ * 25.4));
      case PdmNumColors: return 1 << 24;
      case PdmDepth: return 32;
      case PdmDpiX:
      case PdmDpiY:
      case PdmPhysicalDpiX:
      case PdmPhysicalDpiY: return int(std::lround(dpi_));
      case PdmDevicePixelRatio: return 1;
      case PdmDevicePixelRatioScaled: return int(QPaintDevice::devicePixelRatioFScale());
      default: return 0;
    }
  }

 private:
  int width_, height_;
  double dpi_;
  mutable TextRecordingEngine engine_;
};

QString describe(const DrawnText& t) {
  return QString("'%1' at (%2, %3, %4 x %5)")
      .arg(t.text.left(40))
      .arg(t.rect.x(), 0, 'f', 0)
      .arg(t.rect.y(), 0, 'f', 0)
      .arg(t.rect.width(), 0, 'f', 0)
      .arg(t.rect.height(), 0, 'f', 0);
}

}  // namespace

LayoutReport check_layout(const Figure& figure, const ExportOptions& o, double tolerance) {
  TextRecordingDevice device(o.width, o.height, o.dpi);
  {
    QPainter p(&device);
    paint_page(figure, p, o);
  }
  LayoutReport report;
  report.texts = std::move(device.engine().texts);
  double scale = o.dpi / 96.0;
  QRectF page(0, 0, o.width / scale, o.height / scale);
  for (DrawnText& t : report.texts) {
    t.rect = QRectF(t.rect.x() / scale, t.rect.y() / scale, t.rect.width() / scale,
                    t.rect.height() / scale);
    if (!page.adjusted(-tolerance, -tolerance, tolerance, tolerance).contains(t.rect))
      t.clipped = true;
    if (t.clipped) report.problems.push_back("clipped: " + describe(t));
  }
  // Pairs sorted by left edge: a pair can overlap only while the next left
  // edge is inside the current right edge.
  std::vector<size_t> order(report.texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return report.texts[a].rect.left() < report.texts[b].rect.left();
  });
  for (size_t i = 0; i < order.size(); ++i) {
    const QRectF& a = report.texts[order[i]].rect;
    for (size_t j = i + 1; j < order.size(); ++j) {
      const QRectF& b = report.texts[order[j]].rect;
      if (b.left() >= a.right() - tolerance) break;
      QRectF both = a.intersected(b);
      if (both.width() > tolerance && both.height() > tolerance)
        report.problems.push_back("overlap: " + describe(report.texts[order[i]]) + " and " +
                                  describe(report.texts[order[j]]));
    }
  }
  return report;
}

}  // namespace kvscope::views
