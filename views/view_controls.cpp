#include "views/view_controls.h"

namespace kvscope::views {

QWidget* controls_row(QHBoxLayout** layout) {
  auto* w = new QWidget;
  *layout = new QHBoxLayout(w);
  (*layout)->setContentsMargins(6, 2, 6, 2);
  return w;
}

QLabel* controls_hint(const QString& text) {
  auto* label = new QLabel(text);
  label->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  label->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  label->setToolTip(text);
  return label;
}

void refill_combo(QComboBox* c, const QStringList& items, int current) {
  QStringList shown;
  for (int i = 0; i < c->count(); ++i) shown << c->itemText(i);
  c->blockSignals(true);
  if (shown != items) {
    c->clear();
    c->addItems(items);
  }
  c->setCurrentIndex(std::max(0, current));
  c->blockSignals(false);
}

}  // namespace kvscope::views
