// The sweep panel: a `kvscope sweep` folder's figures (views::sweep_figure_kinds:
// the depth x length grid per policy and task, or the score against the KV
// memory held, one line per policy), coloured or plotted by the chosen metric,
// with the `kvscope why` explanation of the clicked cell beside it. Clicking a
// cell (a point of the curve: a missed cell of it first) asks the main window
// to open its trace at the step where the policy diverged from the full cache
// (the answer step when it did not), with the needle tokens selected in every
// view.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QTextBrowser>
#include <QWidget>
#include <memory>
#include <vector>

#include "views/sweep_results_figure.h"
#include "views/trace_service.h"

namespace kvscope::gui {

// The painted figure; reports a click as the first cell of the mark hit.
class SweepCanvas : public QWidget {
  Q_OBJECT
 public:
  explicit SweepCanvas(QWidget* parent = nullptr);
  void set_figure(std::shared_ptr<views::SweepResultsFigure> figure);
  std::shared_ptr<views::SweepResultsFigure> figure() const { return figure_; }

 signals:
  void cellClicked(QString cell_id);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;

 private:
  std::shared_ptr<views::SweepResultsFigure> figure_;
};

class SweepPanel : public QWidget {
  Q_OBJECT
 public:
  SweepPanel(views::TraceService* service, QWidget* parent = nullptr);
  // Reads DIR/results.csv (small: read here) and shows its grid. Throws
  // InputError naming the file when it is missing or malformed.
  void open(const QString& dir);
  QString folder() const { return dir_; }
  SweepCanvas* canvas() const { return canvas_; }
  // Shows the figure of that kind (views::sweep_figure_kinds' name); false
  // when there is none.
  bool show_figure(const QString& kind);
  // Shows the cell's explanation and emits openCell (as a click does).
  void select_cell(const QString& cell_id);

 signals:
  // The trace of a clicked cell, the step to show and the needle tokens.
  void openCell(QString trace, qint64 step, std::vector<int64_t> needle);
  void explained(QString cell_id);

 private:
  void rebuild();
  // Fills the metric choices with the chosen figure kind's, keeping the
  // current metric where the kind shows it.
  void fill_metrics();
  views::TraceService* service_;
  QString dir_;
  std::vector<sweep::ResultRow> rows_;
  QComboBox* kind_;
  QComboBox* metric_;
  QLabel* summary_;
  SweepCanvas* canvas_;
  QTextBrowser* why_;
  QString selected_;
};

}  // namespace kvscope::gui
