// Gate scores: the per-token score strip of one gate at the current kv head
// with its threshold, and the head's score histogram.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/task_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

class GatesFigure : public Figure {
 public:
  static std::shared_ptr<GatesFigure> load(TraceData& data, const Selection& sel, int gate = 0);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  int layer = 0, kv_head = 0, gate = -1;
  int64_t selected_token = -1;
  QString gate_name, meaning;
  QStringList gate_names;
  double threshold = NAN;
  std::vector<float> values;  // per token (NaN: no score)
  std::vector<uint8_t> held;  // per token at the current step
  // Scores all positive and spanning more than two decades (WG-KV's ~1e-3
  // next to ~1) are shown on a log axis, where a linear one draws them flat.
  bool log_scale = false;
  TaskSpans spans;                 // needle and question tokens
  float lo = 0, hi = 1;            // the value axis, in log10 units when log_scale
  std::vector<int64_t> histogram;  // kBins over [lo, hi]
  // Sets log_scale, lo, hi and the histogram from values and threshold.
  void fit_axis();
  // A score on the value axis (log10 of it when log_scale).
  double axis(double v) const { return log_scale ? std::log10(std::max(v, 1e-30)) : v; }
  static constexpr int kBins = 40;
};

}  // namespace kvscope::views
