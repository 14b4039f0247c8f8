// The figures drawn from a sweep's results table (docs/sweeps.md) rather than
// from one trace: the Sweep dock and `kvscope export DIR --view sweep|pareto`.
// Their marks stand for cells of the table, so each maps a point back to the
// cells it drew there (a click opens one's trace) and marks a chosen cell.
// The kinds are one table (sweep_figure_kinds): the grid (depth x length),
// the memory curve (score against KV bytes held, one line per policy) and the
// retrieval heads (how often each head is in a causal search's minimal set).
#pragma once

#include <QString>
#include <QStringList>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/sweep/results_table.h"
#include "views/figure.h"

namespace kvscope::views {

// What a sweep figure shows of each cell.
enum class SweepMetric { Success, Score, NeedleSurvival, Kl, CausalSet };
// "success", "score", "needle-survival", "kl", "causal-set" (the --metric values).
QString sweep_metric_name(SweepMetric m);
// Throws InputError naming --metric for an unknown name.
SweepMetric sweep_metric_from_name(const QString& name);
// The metric of one cell that ran; NaN when the table does not know it (no
// needle, no oracle). Tables before the score column: success is the score.
double sweep_metric_value(const sweep::ResultRow& row, SweepMetric m);
// What the metric is, for axis titles and legends ("share of the answers found").
QString sweep_metric_label(SweepMetric m);
// A policy spec as a label: file parameters (gates=PATH) dropped — the spec in
// full is in the table, the tooltip and the CSV.
QString sweep_policy_label(const std::string& spec);

// A task as a panel header: a dataset's file by its name
// ("dataset:file=/data/d.jsonl,scorer=f1" -> "dataset:file=d.jsonl,scorer=f1");
// the path is in the table, the tooltip and the CSV.
QString sweep_task_label(const std::string& task);

class SweepResultsFigure : public Figure {
 public:
  SweepResultsFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric)
      : name_(std::move(name)), rows_(std::move(rows)), metric_(metric) {}

  // The cells drawn under `point` when painted into `area` on the screen,
  // the one a click opens first (empty when the point is on none).
  virtual std::vector<const sweep::ResultRow*> cell_at(const QRectF& area,
                                                       const QPointF& point) const = 0;
  // Where the mark holding cell `cell_id` is drawn on the screen in `area`
  // (empty when no such cell).
  virtual QRectF cell_area(const QRectF& area, const std::string& cell_id) const = 0;
  // The tooltip of the mark under `point` (empty when none).
  virtual QString tooltip(const QRectF& area, const QPointF& point) const = 0;

  // Marks the mark holding this cell.
  void set_highlight(const std::string& cell_id) { highlight_ = cell_id; }
  const std::vector<sweep::ResultRow>& rows() const { return rows_; }
  SweepMetric metric() const { return metric_; }

 protected:
  // One line per cell for tooltips: seed, verdict, expected and generated
  // text or the error; at most `limit` lines, then how many more.
  static QString describe_cells(const std::vector<const sweep::ResultRow*>& cells, size_t limit);

  QString name_;
  std::vector<sweep::ResultRow> rows_;
  SweepMetric metric_;
  std::string highlight_;
};

// A kind of sweep figure: its --view name, its label in the GUI, the metrics
// it can show (the first is its default) and how it is made.
struct SweepFigureKind {
  const char* name;
  const char* label;
  std::vector<SweepMetric> metrics;
  std::function<std::shared_ptr<SweepResultsFigure>(QString, std::vector<sweep::ResultRow>,
                                                    SweepMetric)>
      make;
};
const std::vector<SweepFigureKind>& sweep_figure_kinds();
// The kind called `name`, or nullptr.
const SweepFigureKind* find_sweep_figure_kind(const std::string& name);
// A figure of kind `kind` (a name from sweep_figure_kinds) with `metric`
// given by name (empty: the kind's default). Throws InputError naming
// --metric when the kind does not show that metric.
std::shared_ptr<SweepResultsFigure> make_sweep_figure(const std::string& kind, QString name,
                                                      std::vector<sweep::ResultRow> rows,
                                                      const QString& metric);

}  // namespace kvscope::views
