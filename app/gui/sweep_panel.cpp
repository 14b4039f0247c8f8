#include "app/gui/sweep_panel.h"

#include <QFileInfo>
#include <QHBoxLayout>
#include <QMouseEvent>
#include <QPainter>
#include <QSignalBlocker>
#include <QSplitter>
#include <QToolTip>
#include <QVBoxLayout>
#include <filesystem>

#include "core/analysis/why.h"
#include "core/sweep/results_table.h"

namespace kvscope::gui {

SweepCanvas::SweepCanvas(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setMinimumSize(240, 180);
}

void SweepCanvas::set_figure(std::shared_ptr<views::SweepResultsFigure> figure) {
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

void SweepCanvas::mouseMoveEvent(QMouseEvent* event) {
  if (!figure_) return;
  const QString tip = figure_->tooltip(QRectF(rect()), event->position());
  if (tip.isEmpty()) {
    QToolTip::hideText();
    return;
  }
  QToolTip::showText(event->globalPosition().toPoint(), tip, this);
}

SweepPanel::SweepPanel(views::TraceService* service, QWidget* parent)
    : QWidget(parent), service_(service) {
  kind_ = new QComboBox;
  kind_->setObjectName("sweepFigure");
  for (const views::SweepFigureKind& k : views::sweep_figure_kinds())
    kind_->addItem(QString::fromUtf8(k.label), QString(k.name));
  metric_ = new QComboBox;
  metric_->setObjectName("sweepMetric");
  fill_metrics();
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
  bar->addWidget(new QLabel("Show"));
  bar->addWidget(metric_);
  bar->addWidget(kind_);
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
  connect(kind_, &QComboBox::currentIndexChanged, this, [this] {
    fill_metrics();
    rebuild();
  });
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

bool SweepPanel::show_figure(const QString& kind) {
  const int index = kind_->findData(kind);
  if (index < 0) return false;
  kind_->setCurrentIndex(index);
  return true;
}

void SweepPanel::fill_metrics() {
  const QString current = metric_->currentData().toString();
  const QSignalBlocker quiet(metric_);
  metric_->clear();
  for (views::SweepMetric m :
       views::find_sweep_figure_kind(kind_->currentData().toString().toStdString())->metrics)
    metric_->addItem(views::sweep_metric_label(m), views::sweep_metric_name(m));
  metric_->setCurrentIndex(std::max(0, metric_->findData(current)));
}

void SweepPanel::rebuild() {
  if (dir_.isEmpty() || metric_->count() == 0) return;
  auto fig = views::make_sweep_figure(kind_->currentData().toString().toStdString(),
                                      QFileInfo(dir_).fileName(), rows_,
                                      metric_->currentData().toString());
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
