// The memory curve of a sweep: the field's main figure (the kvpress
// leaderboard's score against compression), one panel per task, the KV cache
// bytes a cell's trace held (mean over its decode steps) across and the
// metric up, one line per policy through its budgets (the plan's `budgets`
// axis), each point the mean over the point's cells (depths, lengths, seeds,
// dataset rows) with a 95 % band: Wilson's interval where every cell's value
// is 0 or 1 (success, a needle's score: the point is a share of cells, and
// 0 of 4 is not certain), mean ± 1.96 standard errors otherwise. A policy without a budget is
// one point; `full` is also a dashed line across the panel, the score that
// memory buys back. A dataset's rows are one task's cells. Clicking a point opens one of its cells'
// traces, a missed one first. Drawn as the "pareto" kind of sweep_results_figure.h.
#pragma once

#include <QString>
#include <optional>
#include <string>
#include <vector>

#include "views/legend.h"
#include "views/sweep_results_figure.h"

namespace kvscope::views {

class ParetoFigure : public SweepResultsFigure {
 public:
  // One point: a policy at one budget on one task.
  struct Point {
    size_t task = 0, line = 0;
    std::optional<double> budget;
    std::vector<size_t> rows;  // indices into rows(): missed cells first, failed last
    int ran = 0;               // cells that ran and have the metric
    double kv_bytes = 0;       // mean of the cells' kv_bytes_mean
    double kv_peak = 0;        // largest kv_bytes_peak
    double value = 0, lo = 0, hi = 0;
  };

  ParetoFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric);

  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  QString missing_data() const override;
  // The cells of the point nearest to `point` within a few pixels.
  std::vector<const sweep::ResultRow*> cell_at(const QRectF& area,
                                               const QPointF& point) const override;
  QRectF cell_area(const QRectF& area, const std::string& cell_id) const override;
  QString tooltip(const QRectF& area, const QPointF& point) const override;

  // Points with at least one cell that ran, in task, line, budget order.
  const std::vector<Point>& points() const { return points_; }
  const std::vector<std::string>& tasks() const { return tasks_; }
  // Tasks by sweep::dataset_of (a dataset's rows are one task).
  // Policy specs without the plan's budget (sweep::press_of), one per line;
  // "model-file · spec" when the sweep has several models.
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  struct Panel {
    QRectF plot, header;
  };
  struct Layout {
    QRectF title, legend;
    std::vector<Panel> panels;  // one per task
  };
  Layout layout(const QRectF& area, QPaintDevice* device) const;
  QPointF position(const Layout& l, const Point& pt) const;
  // The nearest point within the pick radius; of points drawn on one
  // another, the first line's.
  const Point* point_at(const Layout& l, const QPointF& at) const;
  // "also here: ..." for the points drawn on `shown` (equal bytes, equal value).
  QString hidden_behind(const Layout& l, const Point& shown) const;
  // A line's place among the lines other than full, its colour and marker.
  size_t line_style(size_t line) const;
  QColor line_color(size_t line) const;
  int line_marker(size_t line) const;
  std::vector<LegendEntry> legend_entries() const;
  void paint_panel(QPainter& p, const Layout& l, size_t task) const;
  // A task's x axis: its bytes in one unit (B, KiB, MiB, GiB) and its range
  // (a dataset's rows are short where a needle prompt is long); the y range
  // is shared, so panels compare at a glance. Fitted once, after the points.
  struct TaskAxis {
    double unit = 1, x_max = 1;
    QString unit_name = "bytes";
  };
  void fit_axes();

  std::vector<std::string> tasks_, lines_;
  std::vector<Point> points_;
  std::vector<TaskAxis> axes_;
  double y_max_ = 1;
};

}  // namespace kvscope::views
