// The needle view: where a retrieval task's needle went, in one figure.
//   - layers x kv heads: the share of the needle's tokens each head holds at
//     the current step (a colour bar from none to all);
//   - heads x needle tokens: the step each head lost each needle token
//     (evicted or never admitted), or that it kept it;
//   - attention mass on the needle over the decode steps: the policy's
//     (/attention/received, mean over kv heads), the compared trace's when
//     one is set (a full-cache run of the same prompt answers "policy vs
//     full"), and the full cache's mass on keys the policy no longer held
//     (/oracle lost mass); the answer step (first decode step) marked.
// The trace records the full cache's lost mass, not its mass on the needle:
// that comes only from a compared full-cache trace.
#pragma once

#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"

namespace kvscope::views {

class NeedleFigure : public Figure {
 public:
  // `compare` (may be null): a second trace of the same prompt.
  static std::shared_ptr<NeedleFigure> load(TraceData& data, TraceData* compare,
                                            const Selection& sel);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  QString missing_data() const override;
  void write_csv(QTextStream& out) const override;

  // Share of the needle's tokens held by (layer, kv head) at `step`.
  double held_share(int layer, int kv_head, int64_t step) const;

  int layer = 0, kv_head = 0;
  int64_t layers = 0, kv_heads = 0, n_steps = 0, step = 0;
  int64_t answer_step = -1;     // first decode step (-1: none yet)
  std::vector<int64_t> needle;  // token indices
  QString needle_text;
  // Per (l * K + k) * needle.size() + i: admit and evict step of needle token i.
  std::vector<int32_t> admit, evict;
  // Per step (NaN where not recorded): mean over kv heads of the received
  // mass on the needle; the compared trace's; the oracle's lost mass.
  std::vector<double> mass, compare_mass, lost_mass;
  QString name, compare_name;

 private:
  void paint_grid(QPainter& p, const QRectF& r) const;
  void paint_losses(QPainter& p, const QRectF& r) const;
  void paint_mass(QPainter& p, const QRectF& r) const;
};

}  // namespace kvscope::views
