#include "app/gui/sweep_panel.h"

#include <QFileInfo>
#include <QHBoxLayout>
#include <QMouseEvent>
#include <QPainter>
#include <QSplitter>
#include <QToolTip>
#include <QVBoxLayout>
#include <cmath>
#include <filesystem>

#include "core/analysis/why.h"
#include "core/sweep/results_table.h"

namespace kvscope::gui {

SweepCanvas::SweepCanvas(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setMinimumSize(240, 180);
}

void SweepCanvas::set_figure(std::shared_ptr<views::SweepFigure> figure) {
  figure_ = std::move(figure);
  update();
}

void SweepCanvas::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing);
  p.fillRect(rect(), Qt::white);
  if (figure_) figure_->paint(p, QRectF(rect()));
}

void SweepCanvas::mousePressEvent(QMouseEvent* event) {
  if (!figure_) return;
  const auto rows = figure_->cell_at(QRectF(rect()), event->position());
  if (!rows.empty()) emit cellClicked(QString::fromStdString(rows.front()->cell_id));
}

namespace {
// "found", "missed", or for a multi-answer task found in part "missed (75 %
// of the answers found)".
QString answer_verdict(const sweep::ResultRow& r) {
  const int8_t success = int8_t(r.success.value_or(0));
  if (success == 1) return "found";
  const std::string partial = analysis::partial_answers(success, r.score.value_or(NAN));
  return partial.empty() ? "missed" : QString::fromStdString("missed (" + partial + ")");
}
}  // namespace

void SweepCanvas::mouseMoveEvent(QMouseEvent* event) {
  if (!figure_) return;
  const auto rows = figure_->cell_at(QRectF(rect()), event->position());
  if (rows.empty()) {
    QToolTip::hideText();
    return;
  }
  const sweep::ResultRow& r = *rows.front();
  QString tip = QString("%1\n%2\n%3 tokens, depth %4")
                    .arg(QString::fromStdString(r.policy), QString::fromStdString(r.task_base))
                    .arg(r.tokens.value_or(0))
                    .arg(r.depth.value_or(0));
  for (const sweep::ResultRow* row : rows)
    tip += row->ok() ? QString("\nseed %1: %2, expected \"%3\", generated \"%4\"")
                           .arg(row->seed.value_or(0))
                           .arg(answer_verdict(*row))
                           .arg(QString::fromStdString(row->expected),
                                QString::fromStdString(row->generated).left(60))
                     : QString("\nseed %1: failed: %2")
                           .arg(row->seed.value_or(0))
                           .arg(QString::fromStdString(row->error).left(80));
  QToolTip::showText(event->globalPosition().toPoint(), tip + "\n(click: open its trace)", this);
}

SweepPanel::SweepPanel(views::TraceService* service, QWidget* parent)
    : QWidget(parent), service_(service) {
  metric_ = new QComboBox;
  metric_->setObjectName("sweepMetric");
  metric_->addItem("answer found", "success");
  metric_->addItem("answer score", "score");
  metric_->addItem("needle survival", "needle-survival");
  summary_ = new QLabel;
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  canvas_ = new SweepCanvas;
  why_ = new QTextBrowser;
  why_->setObjectName("sweepWhy");
  why_->setMinimumWidth(260);
  why_->setPlaceholderText(
      "Click a cell: its trace opens at the step where the policy diverged, "
      "with the needle selected, and `kvscope why` explains it here.");
  auto* bar = new QHBoxLayout;
  bar->addWidget(new QLabel("Colour by"));
  bar->addWidget(metric_);
  bar->addWidget(summary_, 1);
  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(canvas_);
  split->addWidget(why_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addLayout(bar);
  layout->addWidget(split, 1);
  connect(metric_, &QComboBox::currentIndexChanged, this, [this] { rebuild(); });
  connect(canvas_, &SweepCanvas::cellClicked, this, &SweepPanel::select_cell);
}

void SweepPanel::open(const QString& dir) {
  rows_ = sweep::read_results_csv(sweep::results_csv_path(dir.toStdString()));
  dir_ = dir;
  selected_.clear();
  why_->clear();
  int64_t ok = 0, found = 0;
  for (const sweep::ResultRow& r : rows_) ok += r.ok(), found += r.success.value_or(0) == 1;
  summary_->setText(QString("%1: %2 cells, %3 found the answer, %4 failed to run")
                        .arg(QFileInfo(dir).fileName())
                        .arg(rows_.size())
                        .arg(found)
                        .arg(int64_t(rows_.size()) - ok));
  rebuild();
}

void SweepPanel::rebuild() {
  if (dir_.isEmpty()) return;
  auto fig = std::make_shared<views::SweepFigure>(
      QFileInfo(dir_).fileName(), rows_,
      views::SweepFigure::metric_from_name(metric_->currentData().toString()));
  fig->set_highlight(selected_.toStdString());
  canvas_->set_figure(fig);
}

void SweepPanel::select_cell(const QString& cell_id) {
  const sweep::ResultRow* row = nullptr;
  for (const sweep::ResultRow& r : rows_)
    if (QString::fromStdString(r.cell_id) == cell_id) row = &r;
  if (!row) return;
  selected_ = cell_id;
  rebuild();
  if (!row->ok()) {
    why_->setPlainText(
        QString("Cell %1 failed to run:\n%2").arg(cell_id, QString::fromStdString(row->error)));
    emit explained(cell_id);
    return;
  }
  const std::string trace = (std::filesystem::path(dir_.toStdString()) / row->trace).string();
  why_->setPlainText("Explaining " + QString::fromStdString(trace) + " …");
  struct Explained {
    std::string text;
    int64_t step = 0;
    std::vector<int64_t> needle;
  };
  // The trace is read on the worker, like every other read.
  service_->request<Explained>(
      trace, "sweep-why",
      [](views::TraceData& d) {
        const analysis::WhyReport w = analysis::explain_retrieval(d.reader(), 0.1);
        Explained e;
        e.text = analysis::format_why(w);
        e.step = w.divergence_step >= 0 ? w.divergence_step : std::max<int64_t>(0, w.answer_step);
        for (const analysis::NeedleToken& t : w.needle) e.needle.push_back(t.token);
        return e;
      },
      [this, cell_id, trace](Explained e) {
        why_->setPlainText(QString("cell %1\n\n").arg(cell_id) + QString::fromStdString(e.text));
        emit explained(cell_id);
        emit openCell(QString::fromStdString(trace), e.step, e.needle);
      },
      this,
      [this, trace](QString error) {
        why_->setPlainText("Cannot explain " + QString::fromStdString(trace) + ":\n" + error);
      });
}

}  // namespace kvscope::gui
