// Attention heatmap: query x key for one layer and query head, from the
// pooled maps through the level-of-detail pyramid. Two grids: a coarse one
// covering the whole map (drawn at once on any pan or zoom) and a detail one
// for the current viewport at the level that fits the pixels. Keys the
// policy no longer holds at the current step are dimmed and marked; the
// current step's query rows are outlined; token text replaces the tick
// numbers once a token is wide enough to read.
#pragma once

#include <QImage>
#include <QRectF>
#include <memory>
#include <optional>
#include <vector>

#include "core/analysis/attention_lod.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/task_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

struct HeatmapOptions {
  bool use_max = false;  // pooled max instead of mean
  ColorMapId map = ColorMapId::Viridis;
  bool log = true;
  bool auto_range = true;
  float lo = 1e-4f, hi = 1.f;  // when !auto_range
  bool show_evicted = true;
  // Token-resolution rows for heads captured at level "dense" (else pooled).
  bool prefer_dense = true;
  // The coarse grid covers the whole map in at most this many cells per
  // side; finer detail is read per viewport.
  double coarse_cells = 768;
};

class HeatmapFigure : public Figure {
 public:
  // Reads the coarse grid, eviction state and token text. `pixels` is the
  // plot size the figure will be shown at.
  static std::shared_ptr<HeatmapFigure> load(TraceData& data, const Selection& sel,
                                             const HeatmapOptions& options, QSizeF pixels);
  // The viewport's grid at the level that fits `pixels` (worker side).
  // `dense_index` >= 0 reads the dense rows of that dense head instead.
  static analysis::AttentionGrid load_detail(TraceData& data, int layer, int head,
                                             const QRectF& viewport_tokens, QSizeF pixels,
                                             int64_t block, int dense_index = -1);

  // The same map at another step: only the eviction state is re-read (the
  // grids do not depend on the step). Copy on the GUI thread, call on the
  // worker.
  std::shared_ptr<HeatmapFigure> at_step(TraceData& data, int64_t step) const;

  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  // Viewport in tokens: x keys, y queries.
  QRectF extent() const;
  QRectF viewport() const { return viewport_; }
  void set_viewport(const QRectF& tokens);
  void set_options(const HeatmapOptions& options);
  const HeatmapOptions& options() const { return options_; }
  // `image`, when given, is the grid already coloured with scale() (built on
  // the worker so that the GUI thread only blits).
  void set_detail(analysis::AttentionGrid grid, QImage image = QImage());
  // The grid coloured as this figure would colour it (any thread).
  static QImage colorize_grid(const analysis::AttentionGrid& grid, const HeatmapOptions& options,
                              const ColorScale& scale);
  // True when the detail grid does not cover the viewport at the level that
  // fits `pixels`.
  bool wants_detail(QSizeF pixels) const;
  // The plot in `area` before any zoom (for sizing detail reads).
  static QRectF plot_rect(const QRectF& area);
  // The plot as paint() lays it out at the current viewport: zoomed in far
  // enough to label tokens, the margins grow. Mouse mapping uses this.
  QRectF zoomed_plot_rect(const QRectF& area) const;
  ColorScale scale() const;
  // Value under a point of the plot (NaN outside), for tooltips and tests.
  float value_at(double key_token, double query_token) const;

  std::string trace;  // path of the trace it shows
  int layer = 0, head = 0, kv_head = 0;
  int64_t step = 0, n_tokens = 0, block = 1;
  int64_t step_token_begin = 0, step_token_end = 0;  // queries fed by the step
  bool available = false;  // pooled attention captured (or dense rows for this head)
  int dense_index = -1;    // >= 0: showing /attention/dense rows of this dense head
  QString source_note;
  std::vector<uint8_t> key_held;  // per token at the step
  std::shared_ptr<const std::vector<QString>> token_text;
  TaskSpans spans;                // needle and question tokens
  std::vector<int64_t> selected;  // selected tokens (sorted): outlined as key columns

 private:
  bool labels_tokens(const QRectF& plot) const;
  plot::Frame frame(const QRectF& area) const;
  void set_step_state(TraceData& data, int64_t step);
  void paint_grid(QPainter& p, const QRectF& plot, const analysis::AttentionGrid& g,
                  QImage& cache) const;
  void paint_evicted(QPainter& p, const QRectF& plot) const;
  void paint_selected(QPainter& p, const QRectF& plot, const plot::Map& mkey) const;
  void paint_token_labels(QPainter& p, const QRectF& plot) const;
  analysis::AttentionGrid coarse_;
  std::optional<analysis::AttentionGrid> detail_;
  HeatmapOptions options_;
  QRectF viewport_;
  mutable QImage coarse_image_, detail_image_;
  std::vector<int64_t> not_held_prefix_;
};

}  // namespace kvscope::views
