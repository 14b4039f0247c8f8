#include "views/figure_widget.h"

#include <QComboBox>
#include <QContextMenuEvent>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QMenu>
#include <QMessageBox>
#include <QPainter>
#include <QSpinBox>

#include "core/common/check.h"
#include "views/view_registry.h"

namespace kvscope::views {

FigureWidget::FigureWidget(const QString& name, CurrentState* state, TraceService* service,
                           QWidget* parent)
    : QWidget(parent), state_(state), service_(service), name_(name) {
  setObjectName(name);
  setMinimumSize(240, 160);
  setAttribute(Qt::WA_OpaquePaintEvent);
  state_->attach(this);
}

FigureWidget::~FigureWidget() {
  state_->detach(this);
}

uint32_t FigureWidget::reload_on() const {
  return kTraceChanged | kStepChanged | kHeadChanged | kTraceGrew;
}

void FigureWidget::state_changed(const Selection&, uint32_t changes) {
  if (changes & reload_on()) reload();
}

void FigureWidget::reload() {
  const Selection& sel = state_->selection();
  if (sel.trace.empty()) return;
  loading_ = true;
  auto work = loader(sel);
  service_->request<std::shared_ptr<Figure>>(
      sel.trace, name_, std::move(work),
      [this](std::shared_ptr<Figure> fig) {
        std::shared_ptr<Figure> previous = std::move(figure_);
        figure_ = std::move(fig);
        adopt(previous);
        loading_ = false;
        error_.clear();
        update();
        emit figureLoaded();
      },
      this,
      [this](QString error) {
        loading_ = false;
        error_ = error;
        update();
        emit loadFailed(error);
      },
      priority());
  update();
}

void FigureWidget::set_option(const std::string& name, const std::string& value) {
  options_[name] = value;
  reload();
}

FigureRequest FigureWidget::request(const Selection& sel) const {
  FigureRequest q;
  q.view = name_;
  q.selection = sel;
  q.options = options_;
  q.pixels = QSizeF(size());
  return q;
}

std::function<std::shared_ptr<Figure>(TraceData&)> FigureWidget::loader(const Selection& sel) {
  const ViewDescriptor* d = find_view(name_);
  KVSCOPE_CHECK(d, "no registered view is named " + name_.toStdString());
  return [d, q = request(sel)](TraceData& data) -> std::shared_ptr<Figure> {
    TraceData* compare = q.selection.compare.empty() ? nullptr : &data.peer(q.selection.compare);
    return d->figure(data, compare, q);
  };
}

int FigureWidget::priority() const {
  // The central view first; then views on screen; hidden tabs last.
  const ViewDescriptor* d = find_view(name_);
  if (d && d->area == DockArea::Central) return 2;
  return isVisible() ? 1 : 0;
}

void FigureWidget::paintEvent(QPaintEvent*) {
  QElapsedTimer timer;
  timer.start();
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing);
  p.fillRect(rect(), Qt::white);
  if (figure_) {
    figure_->paint(p, area());
  } else if (!error_.isEmpty()) {
    plot::message(p, area(), error_);
  } else {
    plot::message(p, area(),
                  state_->selection().trace.empty() ? "open a trace (File ▸ Open, or drop one here)"
                                                    : "loading…");
  }
  if (!error_.isEmpty() && figure_) {
    p.setPen(palette::kVermillion);
    p.drawText(rect().adjusted(6, 6, -6, -6), Qt::AlignBottom | Qt::AlignLeft, error_);
  }
  last_frame_ms_ = double(timer.nsecsElapsed()) / 1e6;
}

void FigureWidget::export_to(const QString& path, const ExportOptions& options) const {
  if (!figure_) throw std::runtime_error("nothing to export yet: the view has not loaded");
  export_figure(*figure_, path, options);
}

void FigureWidget::contextMenuEvent(QContextMenuEvent* event) {
  QMenu menu(this);
  menu.addAction("Export figure (PNG, SVG, PDF)…", this, &FigureWidget::export_dialog)
      ->setEnabled(bool(figure_));
  menu.addAction("Export data (CSV)…", this, &FigureWidget::export_csv_dialog)
      ->setEnabled(bool(figure_));
  menu.addSeparator();
  menu.addAction("Maximise / restore this view (Ctrl+M)", this,
                 [this] { emit maximiseRequested(name_); });
  menu.exec(event->globalPos());
}

void FigureWidget::export_dialog() {
  QString path = QFileDialog::getSaveFileName(this, "Export figure", name_ + ".pdf",
                                              "PDF (*.pdf);;SVG (*.svg);;PNG (*.png)");
  if (path.isEmpty()) return;
  QDialog d(this);
  d.setWindowTitle("Figure size");
  QFormLayout form(&d);
  QSpinBox w, h;
  QDoubleSpinBox dpi;
  w.setRange(16, 20000);
  h.setRange(16, 20000);
  dpi.setRange(10, 2400);
  dpi.setValue(200);
  w.setValue(int(width() * 200 / 96.0));
  h.setValue(int(height() * 200 / 96.0));
  QComboBox preset;
  preset.addItem("this view's size at 200 dpi");
  for (const ExportPreset& p : export_presets())
    preset.addItem(QString("%1: %2").arg(p.name, p.description));
  connect(&preset, qOverload<int>(&QComboBox::currentIndexChanged), &d, [&](int i) {
    const ExportOptions o =
        i == 0 ? ExportOptions{int(width() * 200 / 96.0), int(height() * 200 / 96.0), 200}
               : export_presets()[size_t(i - 1)].options;
    w.setValue(o.width);
    h.setValue(o.height);
    dpi.setValue(o.dpi);
  });
  form.addRow("preset", &preset);
  form.addRow("width (px)", &w);
  form.addRow("height (px)", &h);
  form.addRow("DPI", &dpi);
  QDialogButtonBox buttons(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  form.addRow(&buttons);
  connect(&buttons, &QDialogButtonBox::accepted, &d, &QDialog::accept);
  connect(&buttons, &QDialogButtonBox::rejected, &d, &QDialog::reject);
  if (d.exec() != QDialog::Accepted) return;
  try {
    export_to(path, ExportOptions{w.value(), h.value(), dpi.value()});
  } catch (const std::exception& e) {
    QMessageBox::warning(this, "Export failed", e.what());
  }
}

void FigureWidget::export_csv_dialog() {
  QString path = QFileDialog::getSaveFileName(this, "Export data", name_ + ".csv", "CSV (*.csv)");
  if (path.isEmpty()) return;
  try {
    export_to(path, ExportOptions{});
  } catch (const std::exception& e) {
    QMessageBox::warning(this, "Export failed", e.what());
  }
}

}  // namespace kvscope::views
