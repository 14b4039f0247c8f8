#include "views/tier_marks.h"

#include <QImage>
#include <QPolygonF>
#include <algorithm>

#include "views/figure.h"

namespace kvscope::views {

namespace {
constexpr int64_t kEventBlock = int64_t(1) << 16;  // events read per hyperslab
}  // namespace

std::vector<trace::Event> head_events(const trace::TraceReader& r, int layer, int kv_head,
                                      trace::EventKind kind, int64_t token) {
  std::vector<trace::Event> out;
  for (int64_t b = 0, n = r.n_events(); b < n; b += kEventBlock)
    for (const trace::Event& e : r.events(b, std::min(n, b + kEventBlock)))
      if (e.layer == layer && e.kv_head == kv_head && e.kind == kind &&
          (token < 0 || e.token == token))
        out.push_back(e);
  return out;
}

std::vector<trace::StallRow> head_stalls(const trace::TraceReader& r, int layer, int kv_head,
                                         int64_t token) {
  std::vector<trace::StallRow> out;
  if (r.n_stalls() == 0) return out;
  for (const trace::StallRow& s : r.stalls())
    if (s.layer == layer && s.kv_head == kv_head && (token < 0 || s.token == token))
      out.push_back(s);
  return out;
}

QString short_reason(const QString& reason) {
  QString s = reason;
  int colon = s.indexOf(": ");
  if (colon > 0 && colon < 16) s = s.mid(colon + 2);  // "promoted: ..." -> "..."
  int paren = s.indexOf(" (");
  if (paren > 0) s = s.left(paren);
  return s;
}

std::vector<MarkClass> mark_classes(const std::vector<uint16_t>& reasons,
                                    const std::vector<std::string>& reason_names) {
  static const QColor others[] = {Qt::black, palette::kPurple, palette::kYellow};
  std::vector<MarkClass> out;
  int other = 0;
  for (uint16_t reason : reasons) {
    MarkClass c;
    c.reason = reason;
    bool named = reason < reason_names.size() && reason_names[reason] != "none";
    c.label = named ? QString::fromStdString(reason_names[reason]) : QString("promoted");
    c.short_label = short_reason(c.label);
    if (c.label.contains("prefetch"))
      c.color = palette::kGreen;
    else if (c.label.contains("reactive"))
      c.color = palette::kOrange;
    else
      c.color = others[other++ % 3];
    out.push_back(c);
  }
  MarkClass stall;
  stall.label = "stall: a reactive fetch made the step wait";
  stall.short_label = "stall";
  stall.color = palette::kVermillion;
  stall.stall = true;
  out.push_back(stall);
  return out;
}

void draw_promotion(QPainter& p, const QPointF& c, const QColor& color, double r) {
  p.setPen(QPen(color.darker(170), 0.6));
  p.setBrush(color);
  p.drawPolygon(
      QPolygonF({c + QPointF(-r, r * 0.8), c + QPointF(r, r * 0.8), c + QPointF(0, -r * 1.1)}));
}

void draw_stall(QPainter& p, const QPointF& c, double r) {
  p.setPen(QPen(Qt::black, 0.9));
  p.setBrush(palette::kVermillion);
  p.drawPolygon(QPolygonF({c + QPointF(0, -r * 1.15), c + QPointF(r, 0), c + QPointF(0, r * 1.15),
                           c + QPointF(-r, 0)}));
}

namespace unattended {

QBrush hatch_brush() {
  // An 8 x 8 tile with one diagonal line, the rest transparent: drawn with
  // DestinationIn it keeps only the lines of what is under it.
  static const QImage tile = [] {
    QImage t(8, 8, QImage::Format_ARGB32);
    t.fill(Qt::transparent);
    for (int i = 0; i < 8; ++i) t.setPixel(i, 7 - i, kHatch.rgb());
    return t;
  }();
  return QBrush(tile);
}

void fill(QPainter& p, const QRectF& r) {
  p.fillRect(r, kFill);
  p.save();
  p.setPen(QPen(kHatch, 0.8));
  p.setClipRect(r);
  for (double x = r.left() - r.height(); x < r.right(); x += 4)
    p.drawLine(QPointF(x, r.bottom()), QPointF(x + r.height(), r.top()));
  p.restore();
}

}  // namespace unattended

MarkClass merge_class() {
  MarkClass c;
  c.label = "absorbed a merged value";
  c.short_label = "merged into";
  c.color = palette::kSky;
  return c;
}

void add_mark_legend(std::vector<LegendEntry>& out, const std::vector<MarkClass>& kinds,
                     bool compact) {
  for (const MarkClass& k : kinds) {
    if (k.count == 0) continue;
    QString text = compact ? k.short_label : QString("%1 (%2)").arg(k.label).arg(k.count);
    QColor color = k.color;
    bool stall = k.stall;
    out.push_back({text, [color, stall](QPainter& p, const QRectF& r) {
                     if (stall)
                       draw_stall(p, r.center(), 4);
                     else
                       draw_promotion(p, r.center(), color, 3.5);
                   }});
  }
}

}  // namespace kvscope::views
