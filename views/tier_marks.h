// What the tier-aware views (timeline, forecast) share: the head's
// promotions grouped by reason and its stalls (/stalls) as marks, the look of
// a tier the attention does not read (held, not attended: a hatched light
// grey), and a legend that flows in rows above a plot so it never covers data.
#pragma once

#include <QBrush>
#include <QColor>
#include <QFontMetricsF>
#include <QPainter>
#include <QString>
#include <functional>
#include <vector>

#include "core/trace/reader.h"
#include "views/legend.h"

namespace kvscope::views {

// The (layer, kv head) events of `kind`, optionally of one token (-1: all),
// in step order: one pass over /events in bounded blocks (there is no
// per-head index), so views call it when the head changes, never per frame.
std::vector<trace::Event> head_events(const trace::TraceReader& r, int layer, int kv_head,
                                      trace::EventKind kind, int64_t token = -1);
// The stalls of (layer, kv head), optionally of one token, in step order.
std::vector<trace::StallRow> head_stalls(const trace::TraceReader& r, int layer, int kv_head,
                                         int64_t token = -1);

// One kind of mark: a promotion reason, or the stalls.
struct MarkClass {
  QString label;        // the reason name ("promoted: prefetch landed (speculative, in time)")
  QString short_label;  // "prefetch landed"
  QColor color;
  bool stall = false;
  uint16_t reason = 0;
  int64_t count = 0;
};
// Classes for promotions with these reasons (in reason order), then "stall"
// last; colours tell a prefetch that landed (green) from a reactive fetch
// (orange) by the reason's words, others get black, purple, yellow.
std::vector<MarkClass> mark_classes(const std::vector<uint16_t>& reasons,
                                    const std::vector<std::string>& reason_names);
// Entries that absorbed a merged value (/merges: CaM, merge-on-evict), drawn
// like a promotion in sky blue.
MarkClass merge_class();
// "promoted: reactive fetch (the step stalled)" -> "reactive fetch".
QString short_reason(const QString& reason);

// Promotion: a small up-tick (triangle pointing up) centred on `c`.
void draw_promotion(QPainter& p, const QPointF& c, const QColor& color, double r);
// Stall: a vermillion diamond with a black outline, drawn on top of everything.
void draw_stall(QPainter& p, const QPointF& c, double r);

namespace unattended {
// Base colour of a held entry the attention does not read, and its hatching.
inline const QColor kFill{222, 222, 222};
inline const QColor kHatch{120, 120, 120};
// A brush of diagonal hatch lines (transparent between them).
QBrush hatch_brush();
// Fills `r` the way the views show a not-attended tier: base colour + hatch.
void fill(QPainter& p, const QRectF& r);
}  // namespace unattended

// Appends an entry per mark kind that has marks: its label and count (compact:
// its short label) beside its mark.
void add_mark_legend(std::vector<LegendEntry>& out, const std::vector<MarkClass>& kinds,
                     bool compact);

}  // namespace kvscope::views
