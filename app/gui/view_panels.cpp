#include "app/gui/view_panels.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QResizeEvent>
#include <QScrollArea>
#include <QScrollBar>
#include <QSpinBox>
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

namespace {
QWidget* row(QHBoxLayout** layout) {
  auto* w = new QWidget;
  *layout = new QHBoxLayout(w);
  (*layout)->setContentsMargins(6, 2, 6, 2);
  return w;
}

// A usage hint that never widens its dock: it is cut when there is no room.
QLabel* hint(const QString& text) {
  auto* label = new QLabel(text);
  label->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  label->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  label->setToolTip(text);
  return label;
}
}  // namespace

QWidget* heatmap_controls(views::HeatmapView* view) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* map = new QComboBox;
  map->addItems(views::color_map_names());
  auto* log = new QCheckBox("log");
  log->setChecked(true);
  auto* max = new QCheckBox("max");
  max->setToolTip("pooled max instead of mean");
  auto* evicted = new QCheckBox("mark evicted keys");
  evicted->setChecked(true);
  auto* dense = new QCheckBox("dense rows");
  dense->setChecked(true);
  dense->setToolTip("token-resolution rows for heads captured at level 'dense'");
  auto* autorange = new QCheckBox("auto range");
  autorange->setChecked(true);
  auto* lo = new QDoubleSpinBox;
  auto* hi = new QDoubleSpinBox;
  for (QDoubleSpinBox* s : {lo, hi}) {
    s->setDecimals(5);
    s->setRange(0, 1);
    s->setSingleStep(0.01);
    s->setEnabled(false);
  }
  lo->setValue(0.0001);
  hi->setValue(1.0);
  auto apply = [=] {
    views::HeatmapOptions o = view->options();
    o.map = views::color_map_from_name(map->currentText());
    o.log = log->isChecked();
    o.use_max = max->isChecked();
    o.show_evicted = evicted->isChecked();
    o.auto_range = autorange->isChecked();
    o.prefer_dense = dense->isChecked();
    o.lo = float(lo->value());
    o.hi = float(hi->value());
    lo->setEnabled(!o.auto_range);
    hi->setEnabled(!o.auto_range);
    view->set_options(o);
  };
  QObject::connect(map, &QComboBox::currentTextChanged, view, apply);
  for (QCheckBox* c : {log, max, evicted, autorange})
    QObject::connect(c, &QCheckBox::toggled, view, apply);
  // The source changes what is read: reload rather than recolour.
  QObject::connect(dense, &QCheckBox::toggled, view, [=] {
    apply();
    view->reload();
  });
  for (QDoubleSpinBox* s : {lo, hi})
    QObject::connect(s, &QDoubleSpinBox::valueChanged, view, apply);
  l->addWidget(new QLabel("colours"));
  l->addWidget(map);
  for (QWidget* c : std::initializer_list<QWidget*>{log, max, evicted, dense, autorange})
    l->addWidget(c);
  l->addWidget(new QLabel("range"));
  l->addWidget(lo);
  l->addWidget(hi);
  l->addStretch();
  l->addWidget(hint("wheel: zoom · drag: pan · double-click: reset"));
  return w;
}

QWidget* overview_controls(views::OverviewView* view) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* metric = new QComboBox;
  metric->setObjectName("overviewMetric");
  metric->addItems(views::overview_metric_names());
  QObject::connect(metric, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_metric(views::OverviewMetric(i)); });
  l->addWidget(new QLabel("sort heads by"));
  l->addWidget(metric);
  l->addStretch();
  return w;
}

QWidget* tokens_controls(views::TokensView* view) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* c = new QComboBox;
  c->addItems({"heads holding (all layers)", "heads holding (layer)", "held by current head",
               "gate score"});
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_coloring(views::TokenColoring(i)); });
  l->addWidget(new QLabel("colour by"));
  l->addWidget(c);
  l->addStretch();
  l->addWidget(hint("hover: per-head status · click: select"));
  return w;
}

QWidget* survival_controls(views::SurvivalView* view) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* h = new QSpinBox;
  h->setRange(-1, 1 << 24);
  h->setValue(-1);
  h->setSpecialValueText("auto");
  QObject::connect(h, qOverload<int>(&QSpinBox::valueChanged), view,
                   [view](int v) { view->set_horizon(v); });
  l->addWidget(new QLabel("horizon h for the per-head map"));
  l->addWidget(h);
  l->addStretch();
  return w;
}

QWidget* gates_controls(views::GatesView* view, const QStringList& gates) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* c = new QComboBox;
  c->setObjectName("gateCombo");
  c->addItems(gates);
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_gate(std::max(0, i)); });
  l->addWidget(new QLabel("gate"));
  l->addWidget(c);
  l->addStretch();
  return w;
}

QWidget* cutoff_controls(views::CutoffView* view) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* label = new QLabel("series");
  auto* c = new QComboBox;
  c->setObjectName("seriesCombo");
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view](int i) { view->set_series(std::max(0, i)); });
  // The names come with each loaded figure (the trace's /series); the choice
  // is offered only when there is one to make.
  QObject::connect(view, &views::FigureWidget::figureLoaded, c, [view, c, label] {
    QStringList names = view->cutoff() ? view->cutoff()->series_names : QStringList();
    QStringList shown;
    for (int i = 0; i < c->count(); ++i) shown << c->itemText(i);
    if (shown != names) {
      c->blockSignals(true);
      c->clear();
      c->addItems(names);
      if (view->cutoff()) c->setCurrentIndex(std::max(0, view->cutoff()->series));
      c->blockSignals(false);
    }
    c->setVisible(names.size() > 1);
    label->setVisible(names.size() > 1);
  });
  c->setVisible(false);
  label->setVisible(false);
  l->addWidget(label);
  l->addWidget(c);
  l->addStretch();
  l->addWidget(hint("click: a decision selects its token and step; elsewhere, the step"));
  return w;
}

namespace {
// Refills `c` with `items` when they changed, selecting `current`, without
// announcing the change (it is the figure's state, not the user's choice).
void refill(QComboBox* c, const QStringList& items, int current) {
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

// A row offering one choice a loaded figure makes possible, shown only when
// there is one to make (more than one item). `choose(view, i)` applies the
// user's pick; `choices(view, &current)` gives the items of the figure just
// loaded and sets the one it shows.
template <class View, class Choose, class Choices>
QWidget* figure_choice_row(View* view, const QString& label_text, const QString& object_name,
                           Choose choose, Choices choices, const QString& hint_text) {
  QHBoxLayout* l;
  QWidget* w = row(&l);
  auto* label = new QLabel(label_text);
  auto* c = new QComboBox;
  c->setObjectName(object_name);
  QObject::connect(c, qOverload<int>(&QComboBox::currentIndexChanged), view,
                   [view, choose](int i) { choose(view, i); });
  QObject::connect(view, &views::FigureWidget::figureLoaded, c, [view, c, label, choices] {
    int current = 0;
    QStringList items = choices(view, &current);
    refill(c, items, current);
    c->setVisible(items.size() > 1);
    label->setVisible(items.size() > 1);
  });
  c->setVisible(false);
  label->setVisible(false);
  l->addWidget(label);
  l->addWidget(c);
  l->addStretch();
  l->addWidget(hint(hint_text));
  return w;
}

}  // namespace

QWidget* budget_controls(views::BudgetView* view) {
  // Item 0: entries by tier; item i > 0: the trace's series i - 1.
  return figure_choice_row(
      view, "show", "budgetSeriesCombo",
      [](views::BudgetView* v, int i) {
        v->set_series(i <= 0 ? views::BudgetFigure::kNoSeries : i - 1);
      },
      [](views::BudgetView* v, int* current) {
        QStringList items = {"entries by tier"};
        if (v->budget())
          for (const QString& n : v->budget()->series_names) items << "per head: " + n;
        *current = v->budget() ? v->budget()->shown_series + 1 : 0;
        return items;
      },
      "click a cell: select that head");
}

QWidget* forecast_controls(views::ForecastView* view) {
  // The time-varying gates come with each loaded figure.
  return figure_choice_row(
      view, "gate", "forecastGateCombo",
      [](views::ForecastView* v, int i) {
        views::ForecastFigure* f = v->forecast();
        if (f && i >= 0 && size_t(i) < f->gate_choices.size())
          v->set_gate(f->gate_choices[size_t(i)]);
      },
      [](views::ForecastView* v, int* current) {
        views::ForecastFigure* f = v->forecast();
        QStringList names = f ? f->gate_choice_names : QStringList();
        if (f)
          for (size_t i = 0; i < f->gate_choices.size(); ++i)
            if (f->gate_choices[i] == f->gate) *current = int(i);
        return names;
      },
      "follows the selected token · click: select the step");
}

QWidget* controls_for(const QString& name, views::FigureWidget* view) {
  if (name == "heatmap") return heatmap_controls(static_cast<views::HeatmapView*>(view));
  if (name == "overview") return overview_controls(static_cast<views::OverviewView*>(view));
  if (name == "tokens") return tokens_controls(static_cast<views::TokensView*>(view));
  if (name == "survival") return survival_controls(static_cast<views::SurvivalView*>(view));
  if (name == "gates") return gates_controls(static_cast<views::GatesView*>(view), {});
  if (name == "cutoff") return cutoff_controls(static_cast<views::CutoffView*>(view));
  if (name == "budget") return budget_controls(static_cast<views::BudgetView*>(view));
  if (name == "forecast") return forecast_controls(static_cast<views::ForecastView*>(view));
  return nullptr;
}

}  // namespace kvscope::gui
