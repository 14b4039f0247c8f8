#include "app/gui/view_panels.h"

#include <QResizeEvent>
#include <QScrollArea>
#include <QScrollBar>
#include <QVBoxLayout>

namespace kvscope::gui {

namespace {

// A view's options row that never sets its dock's minimum width: when the
// dock is narrower than the row, the row scrolls sideways (its scroll bar
// appears under it) instead of widening the window past the screen (the
// docks' rows summed to 1343 px) or cutting its last controls.
class ControlsRow : public QScrollArea {
 public:
  explicit ControlsRow(QWidget* controls) {
    setWidget(controls);
    setWidgetResizable(true);
    setFrameShape(QFrame::NoFrame);
    setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
    setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Fixed);
    fit_height();
  }

 protected:
  void resizeEvent(QResizeEvent* event) override {
    QScrollArea::resizeEvent(event);
    fit_height();
  }

 private:
  void fit_height() {
    bool bar = widget()->minimumSizeHint().width() > width();
    int h = widget()->sizeHint().height() + (bar ? horizontalScrollBar()->sizeHint().height() : 0);
    if (h != height()) setFixedHeight(h);
  }
};

}  // namespace

QWidget* panel(QWidget* controls, QWidget* view) {
  auto* w = new QWidget;
  auto* col = new QVBoxLayout(w);
  col->setContentsMargins(0, 0, 0, 0);
  col->setSpacing(2);
  if (controls) col->addWidget(new ControlsRow(controls));
  col->addWidget(view, 1);
  return w;
}

}  // namespace kvscope::gui
