// The sweep panel: a `kvscope sweep` folder's grid (views::SweepFigure) —
// depth x length per policy and task, coloured by success or needle
// survival — with the `kvscope why` explanation of the clicked cell beside
// it. Clicking a cell asks the main window to open its trace at the step
// where the policy diverged from the full cache (the answer step when it
// did not), with the needle tokens selected in every view.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QTextBrowser>
#include <QWidget>
#include <memory>
#include <vector>

#include "views/sweep_figure.h"
#include "views/trace_service.h"

namespace kvscope::gui {

// The painted grid; reports clicks as the rows (seeds) of the cell hit.
class SweepCanvas : public QWidget {
  Q_OBJECT
 public:
  explicit SweepCanvas(QWidget* parent = nullptr);
  void set_figure(std::shared_ptr<views::SweepFigure> figure);
  std::shared_ptr<views::SweepFigure> figure() const { return figure_; }

 signals:
  void cellClicked(QString cell_id);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;

 private:
  std::shared_ptr<views::SweepFigure> figure_;
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
  // Shows the cell's explanation and emits openCell (as a click does).
  void select_cell(const QString& cell_id);

 signals:
  // The trace of a clicked cell, the step to show and the needle tokens.
  void openCell(QString trace, qint64 step, std::vector<int64_t> needle);
  void explained(QString cell_id);

 private:
  void rebuild();
  views::TraceService* service_;
  QString dir_;
  std::vector<sweep::ResultRow> rows_;
  QComboBox* metric_;
  QLabel* summary_;
  SweepCanvas* canvas_;
  QTextBrowser* why_;
  QString selected_;
};

}  // namespace kvscope::gui
