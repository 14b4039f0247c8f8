// Gate scores: the per-token score strip of one gate at the current kv head
// with its threshold, and the head's score histogram.
#pragma once

#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class GatesFigure : public Figure {
 public:
  static std::shared_ptr<GatesFigure> load(TraceData& data, const Selection& sel, int gate = 0);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  int layer = 0, kv_head = 0, gate = -1;
  int64_t selected_token = -1;
  QString gate_name, meaning;
  QStringList gate_names;
  double threshold = NAN;
  std::vector<float> values;  // per token (NaN: no score)
  std::vector<uint8_t> held;  // per token at the current step
  float lo = 0, hi = 1;
  std::vector<int64_t> histogram;  // kBins over [lo, hi]
  static constexpr int kBins = 40;
};

}  // namespace kvscope::views
