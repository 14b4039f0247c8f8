// The retrieval heads of a sweep as its policies' failures reveal them: for
// each policy (one panel), layers x kv heads coloured by the share of its
// searched misses (cells the causal search ran on and recovered, plan key
// causal) whose minimal set holds the head (docs/causal.md). A click opens
// a cell whose set holds the head.
#pragma once

#include <string>
#include <vector>

#include "views/sweep_results_figure.h"

namespace kvscope::views {

class CausalHeadsFigure : public SweepResultsFigure {
 public:
  struct Panel {
    std::string policy;            // sweep::press_of, model-qualified when several models
    std::vector<size_t> searched;  // rows with a minimal set (recovered)
    int64_t unrecoverable = 0;     // rows where restoring every loss did not help
    int64_t minimal = 0;           // searched rows whose set is confirmed minimal (causal_minimal)
    std::vector<int32_t> count;    // [L * K]: sets holding the head
  };

  CausalHeadsFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric);

  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  QString missing_data() const override;
  std::vector<const sweep::ResultRow*> cell_at(const QRectF& area,
                                               const QPointF& point) const override;
  QRectF cell_area(const QRectF& area, const std::string& cell_id) const override;
  QString tooltip(const QRectF& area, const QPointF& point) const override;

  const std::vector<Panel>& panels() const { return panels_; }
  int64_t layers() const { return L_; }
  int64_t kv_heads() const { return K_; }

 private:
  struct Layout {
    std::vector<QRectF> grids, headers;
    QRectF bar;
    double cw = 0, ch = 0;
  };
  Layout layout(const QRectF& area) const;
  // The (panel, head) under `point`; false: none.
  bool head_at(const QRectF& area, const QPointF& point, size_t* panel, int64_t* head) const;
  bool holds(const sweep::ResultRow& row, int64_t head) const;

  std::vector<Panel> panels_;
  int64_t L_ = 0, K_ = 0;
};

}  // namespace kvscope::views
