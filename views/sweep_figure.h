// The sweep view: the familiar needle-in-a-haystack grid of a `kvscope sweep`
// — one panel per policy (rows) and task (columns), depth down and prompt
// length across, each cell coloured by success, by score (the share of the
// expected answers found, RULER's string_match_all) or by needle survival (the
// share of (layer, kv head) pairs that could read the whole needle when the
// answer was generated). Seeds of a cell are averaged, and so are a dataset's
// rows (one task: sweep::dataset_of). Clicking a cell in the
// GUI opens its trace; cell_at() maps a point to the cell.
// Drawn as the "sweep" kind of sweep_results_figure.h.
#pragma once

#include <QString>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "views/sweep_results_figure.h"

namespace kvscope::views {

class SweepFigure : public SweepResultsFigure {
 public:
  // metric: Success, Score or NeedleSurvival (sweep_figure_kinds' "sweep").
  SweepFigure(QString name, std::vector<sweep::ResultRow> rows, SweepMetric metric);

  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;
  // The rows (seeds) of the cell under the point.
  std::vector<const sweep::ResultRow*> cell_at(const QRectF& area,
                                               const QPointF& point) const override;
  QRectF cell_area(const QRectF& area, const std::string& cell_id) const override;
  QString tooltip(const QRectF& area, const QPointF& point) const override;

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

  std::vector<std::string> policies_, tasks_;
  std::vector<int64_t> lengths_;
  std::vector<double> depths_;
  // (policy, task, length, depth) indices -> cell
  std::map<std::array<size_t, 4>, Cell> cells_;
};

}  // namespace kvscope::views
