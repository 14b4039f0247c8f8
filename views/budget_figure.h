// Head budgets: a layers x kv-heads grid of entries held at the current step,
// and entries over steps for the current head (stacked by tier) against the
// other heads of its layer — what a global-budget policy moves between heads.
// With a per-head series of the trace chosen (by default the first whose
// name contains "hot_budget", e.g. sfc_hot_budget), the right panel shows
// that series for every kv head of the layer (the current one highlighted)
// over the current head's hot-tier entries. Legends sit above their plots.
// When the policy pruned key channels (ThinK, /key_channels), a strip under
// the grid shows the current head's head_dim key channels, the pruned ones
// dark, as of the current step.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/tier_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

class BudgetFigure : public Figure {
 public:
  // `series`: index into the trace's /series to show per head; kAutoSeries
  // picks the first "*hot_budget*" one (none: entries by tier); kNoSeries
  // always shows entries by tier.
  static constexpr int kAutoSeries = -1, kNoSeries = -2;
  static std::shared_ptr<BudgetFigure> load(TraceData& data, const Selection& sel,
                                            int series = kAutoSeries);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  // Grid cell rectangle of head (layer, kv_head) inside a figure area (clicks, tests).
  QRectF grid_cell(const QRectF& area, int layer, int kv_head) const;

  int layer = 0, kv_head = 0;
  int64_t step = 0, n_steps = 0, layers = 0, kv_heads = 0, tiers = 1;
  std::vector<QString> tier_names;
  QString budget_kind;
  int64_t budget = 0;
  std::vector<int32_t> at_step;                    // L*K*R entries after the step
  std::vector<int32_t> series;                     // steps x R of the current head
  std::vector<std::vector<int32_t>> layer_series;  // per kv head of the layer: steps (all tiers)
  int shown_series = -1;                           // index into series_names, -1: entries by tier
  QStringList series_names;                        // the trace's /series
  QString series_name, series_units, series_meaning;
  std::vector<std::vector<float>> head_series;  // per kv head of the layer: steps (NaN: none)
  std::vector<float> series_at_step;            // L*K values of the shown series at the step
  // Key channels (empty when the trace prunes none): head_dim, and the
  // current head's pruned channels as of the step (ascending).
  int64_t head_dim = 0;
  bool prunes_channels = false;
  std::vector<int> pruned_channels;
  std::vector<int64_t> windows;  // per layer: sliding window, 0 = global (/run)
  // The channel strip under the grid (tests check it stays inside the figure).
  QRectF channel_strip(const QRectF& area) const;

  // The right panel: its legend in rows above its plot (tests check they do
  // not meet). `device`: where the text is drawn (its DPI); null: the screen.
  struct Layout {
    QRectF legend, plot;
    bool compact = false;
  };
  Layout series_layout(const QRectF& area, const QPaintDevice* device = nullptr) const;

  int64_t head_total(int l, int k) const;
  // What grid cell (l, k) shows: the shown series at the step, else head_total.
  float grid_value(int l, int k) const;

 private:
  void paint_grid(QPainter& p, const QRectF& r) const;
  void paint_channels(QPainter& p, const QRectF& area) const;
  QRectF grid_area(const QRectF& area) const;
  double caption_room() const;  // px under the grid before the channel strip
  void paint_series(QPainter& p, const QRectF& r) const;
  void paint_head_series(QPainter& p, const QRectF& r) const;
  std::vector<LegendEntry> legend_entries(bool compact) const;
};

}  // namespace kvscope::views
