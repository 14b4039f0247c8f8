// What the views' options rows are built of (each view's controls live in
// its own file; the GUI frames the row above the view, app/gui/view_panels.h).
#pragma once

#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QStringList>
#include <QWidget>

#include "views/figure_widget.h"

namespace kvscope::views {

// An empty row and its layout.
QWidget* controls_row(QHBoxLayout** layout);

// A usage hint that never widens its dock: it is cut when there is no room.
QLabel* controls_hint(const QString& text);

// Refills `c` with `items` when they changed, selecting `current`, without
// announcing the change (it is the figure's state, not the user's choice).
void refill_combo(QComboBox* c, const QStringList& items, int current);

// A row offering one choice a loaded figure makes possible, shown only when
// there is one to make (more than one item). `choose(view, i)` applies the
// user's pick; `choices(view, &current)` gives the items of the figure just
// loaded and sets the one it shows.
template <class View, class Choose, class Choices>
QWidget* figure_choice_row(View* view, const QString& label_text, const QString& object_name,
                           Choose choose, Choices choices, const QString& hint_text) {
  QHBoxLayout* l;
  QWidget* w = controls_row(&l);
  auto* label = new QLabel(label_text);
  auto* c = new QComboBox;
  c->setObjectName(object_name);
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view, choose](int i) { choose(view, i); });
  QObject::connect(view, &FigureWidget::figureLoaded, c, [view, c, label, choices] {
    int current = 0;
    QStringList items = choices(view, &current);
    refill_combo(c, items, current);
    c->setVisible(items.size() > 1);
    label->setVisible(items.size() > 1);
  });
  c->setVisible(false);
  label->setVisible(false);
  l->addWidget(label);
  l->addWidget(c);
  l->addStretch();
  if (!hint_text.isEmpty()) l->addWidget(controls_hint(hint_text));
  return w;
}

}  // namespace kvscope::views
