// Eviction timeline. Head mode: a tokens x steps raster of one kv head —
// each token's row is held (coloured by tier; a tier the attention does not
// read is hatched light grey) from admission to eviction, then evicted;
// folded to pixels on every frame, so cost follows pixels, not tokens x
// steps. The head's promotions (up-ticks, coloured by reason), the entries
// that absorbed a merged value (/merges: sky-blue up-ticks) and stalls
// (/stalls: vermillion diamonds) are marked at (step, token), at most one
// mark per few pixels. Layers mode (seed 003, fig. 6): per layer, how many
// kv heads hold each token at the current step.
#pragma once

#include <QRectF>
#include <memory>

#include "core/analysis/lifetimes.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/task_marks.h"
#include "views/tier_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

enum class TimelineMode { Head, Layers };

class TimelineFigure : public Figure {
 public:
  // A promotion, merge or stall of the head at (step, token); cls indexes mark_kinds.
  struct Mark {
    int32_t step = 0, token = 0;
    uint8_t cls = 0;
  };
  struct Layout {
    QRectF title, legend, plot, colorbar;  // colorbar: layers mode
    bool compact = false;                  // short legend labels (small figures)
    bool token_rows = false;               // head mode: rows labelled with their tokens
    bool token_columns = false;            // layers mode: columns labelled with their tokens
  };

  static std::shared_ptr<TimelineFigure> load(TraceData& data, const Selection& sel,
                                              TimelineMode mode);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  QRectF extent() const;  // x: steps (head mode) or tokens (layers mode)
  QRectF viewport() const { return viewport_; }
  void set_viewport(const QRectF& v);
  // `device`: where the text is drawn (its DPI sizes the legend); null: the screen.
  Layout layout(const QRectF& area, const QPaintDevice* device = nullptr) const;
  QRectF plot_rect(const QRectF& area) const { return layout(area).plot; }
  // Centre of cell (step, token) in `plot` at the current viewport.
  QPointF cell_center(const QRectF& plot, double step, double token) const;
  // The marks in view, per class of mark_kinds, as drawn in `plot`: at most
  // one per `bucket` x `bucket` pixels (many marks fold into one), so the
  // drawing follows pixels.
  std::vector<std::vector<QPointF>> mark_positions(const QRectF& plot, double bucket) const;
  // Marks of each class in view. A class drawn as glyphs would cover more
  // than a sixth of the plot is drawn as cells of the raster instead (dense).
  std::vector<int64_t> marks_in_view() const;
  static bool dense_marks(int64_t count, double glyph_radius, const QRectF& plot);
  // Colour the head-mode raster gives a (step, token) cell (tests).
  QColor cell_color(int64_t step, int64_t token) const;
  // What the cell under (x, y) in viewport coordinates shows, in words (the
  // view's tooltip); empty outside the data.
  QString describe(double x, double y) const;

  TimelineMode mode = TimelineMode::Head;
  int layer = 0, kv_head = 0;
  int64_t step = 0, n_steps = 0, n_tokens = 0, n_kv_heads = 1, n_layers = 1, selected_token = -1;
  std::vector<QString> tier_names;
  StepRanges reconstruction;           // head mode: the policy's context-reconstruction steps
  std::vector<uint8_t> tier_attended;  // per tier: 1 the attention reads it
  bool any_evicted = false, any_rejected = false;
  std::vector<Mark> marks;               // head mode: promotions and stalls, by step
  std::vector<MarkClass> mark_kinds;     // promotion reasons, merges (if any), then stalls
  std::vector<trace::Event> promotions;  // head mode, by step (CSV)
  std::vector<trace::StallRow> stalls;   // head mode, by step (CSV)
  std::vector<trace::MergeRow> merges;   // head mode: the head's /merges, by step
  std::shared_ptr<const analysis::HeadTimeline> head;  // head mode
  std::vector<uint16_t> counts;                        // layers mode: L x T
  std::vector<int32_t> fed_step;                       // layers mode: the step that fed token t
  std::shared_ptr<const std::vector<QString>> token_text;
  TaskSpans spans;  // needle and question tokens

 private:
  // The raster's cells: data window [s0, s1) x [t0, t1) as w x h image
  // pixels, drawn into `target`.
  struct Raster {
    double s0 = 0, s1 = 1, t0 = 0, t1 = 1;
    int w = 1, h = 1;
    QRectF target;
  };
  Raster paint_head(QPainter& p, const QRectF& plot, double device_scale) const;
  void paint_hatch(QPainter& p, const QRectF& plot, const QRectF& target, const QImage& mask,
                   double device_scale) const;
  void paint_marks(QPainter& p, const QRectF& plot, const Raster& raster) const;
  // Token t's merges up to `at_step` (its value folded into others, others'
  // folded into it), in words for the tooltip; empty when none.
  QString describe_merges(int64_t t, int64_t at_step) const;
  std::vector<LegendEntry> legend_entries(bool compact) const;
  void paint_layers(QPainter& p, const QRectF& plot, double device_scale) const;
  void paint_token_columns(QPainter& p, const QRectF& plot) const;
  void paint_layer_ticks(QPainter& p, const QRectF& plot) const;
  QRectF viewport_;
};

// Colour of state class c; a tier whose `attended` flag is 0 gets the
// not-attended base colour (the view hatches it on top).
QColor timeline_class_color(const analysis::TimelineClasses& classes, int c,
                            const std::vector<uint8_t>& attended = {});

}  // namespace kvscope::views
