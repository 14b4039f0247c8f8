// The sweep view: the familiar needle-in-a-haystack grid of a `kvscope sweep`
// — one panel per policy (rows) and task (columns), depth down and prompt
// length across, each cell coloured by success, by score (the share of the
// expected answers found, RULER's string_match_all) or by needle survival (the
// share of (layer, kv head) pairs that could read the whole needle when the
// answer was generated). Seeds of a cell are averaged. Clicking a cell in the
// GUI opens its trace; cell_at() maps a point to the cell.
#pragma once

#include <QString>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "core/sweep/results_table.h"
#include "views/figure.h"

namespace kvscope::views {

class SweepFigure : public Figure {
 public:
  enum class Metric { Success, Score, NeedleSurvival };
  static QStringList metric_names();  // "success", "score", "needle-survival"
  // Throws InputError naming --metric for an unknown name.
  static Metric metric_from_name(const QString& name);

  SweepFigure(QString name, std::vector<sweep::ResultRow> rows, Metric metric);

  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  // The rows (seeds) of the cell under `point` when painted into `area`
  // on the screen (empty when the point is on no cell).
  std::vector<const sweep::ResultRow*> cell_at(const QRectF& area, const QPointF& point) const;
  // Where the cell holding row `cell_id` is drawn on the screen in `area`
  // (empty when no such row).
  QRectF cell_area(const QRectF& area, const std::string& cell_id) const;
  // Marks a cell (by one of its rows' cell ids) with a frame.
  void set_highlight(const std::string& cell_id) { highlight_ = cell_id; }
  const std::vector<sweep::ResultRow>& rows() const { return rows_; }

 private:
  struct Cell {
    std::vector<size_t> rows;  // indices into rows_, one per seed
    double value = 0;          // the metric averaged over the rows that ran
    int ran = 0;               // rows that ran (status ok)
  };
  struct Layout {
    QRectF title, legend;
    double label_width = 0, panel_w = 0, panel_h = 0, gap = 0, top = 0, left = 0;
    double header_h = 0, tick_h = 0, depth_ticks = 0;
    bool values = false;       // cells large enough to print their value
    bool legend_rows = false;  // narrow: the legend flows in rows under the title
  };
  // device: what the text is drawn on (nullptr: the screen).
  Layout layout(const QRectF& area, QPaintDevice* device) const;
  QRectF cell_rect(const Layout& l, size_t policy, size_t task, size_t length, size_t depth) const;
  QColor cell_color(const Cell& c) const;
  QString cell_text(const Cell& c) const;
  void paint_legend(QPainter& p, const Layout& l) const;

  QString name_;
  std::vector<sweep::ResultRow> rows_;
  Metric metric_;
  std::vector<std::string> policies_, tasks_;
  std::vector<int64_t> lengths_;
  std::vector<double> depths_;
  // (policy, task, length, depth) indices -> cell
  std::map<std::array<size_t, 4>, Cell> cells_;
  std::string highlight_;
};

}  // namespace kvscope::views
