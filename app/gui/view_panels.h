// Each dock's content: the view's options row (its descriptor's controls)
// above the view.
#pragma once

#include <QWidget>

namespace kvscope::gui {

// Wraps `view` with `controls` (may be null) in one widget.
QWidget* panel(QWidget* controls, QWidget* view);

}  // namespace kvscope::gui
