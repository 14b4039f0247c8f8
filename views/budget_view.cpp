#include "views/budget_view.h"

#include <QMouseEvent>
#include <algorithm>

#include "views/trace_choices.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

BudgetView::BudgetView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("budget", state, service, parent) {}

void BudgetView::set_series(int series) {
  set_option("series", std::to_string(series));
}

void BudgetView::mouseReleaseEvent(QMouseEvent* e) {
  auto* f = budget();
  if (!f) return;
  for (int l = 0; l < f->layers; ++l)
    for (int k = 0; k < f->kv_heads; ++k)
      if (f->grid_cell(area(), l, k).contains(e->position())) {
        const Selection& s = state_->selection();
        int group = int(std::max<int64_t>(1, s.n_heads / std::max<int64_t>(1, s.n_kv_heads)));
        state_->set_head(l, k * group, nullptr);
        return;
      }
}

namespace {

// Item 0: entries by tier; item i > 0: the trace's series i - 1.
QWidget* budget_controls(FigureWidget* widget) {
  auto* view = static_cast<BudgetView*>(widget);
  return figure_choice_row(
      view, "show", "budgetSeriesCombo",
      [](BudgetView* v, int i) { v->set_series(i <= 0 ? BudgetFigure::kNoSeries : i - 1); },
      [](BudgetView* v, int* current) {
        QStringList items = {"entries by tier"};
        if (v->budget())
          for (const QString& n : v->budget()->series_names) items << "per head: " + n;
        *current = v->budget() ? v->budget()->shown_series + 1 : 0;
        return items;
      },
      "click a cell: select that head");
}

// --series: a series' name or index; "" the first "*hot_budget*" one; "none"
// entries by tier.
ViewOptions budget_options(const ViewOptions& given, const trace::TraceReader& reader,
                           const FigureRequest&) {
  const std::string value = option_text(given, "series");
  const int series = value.empty()     ? BudgetFigure::kAutoSeries
                     : value == "none" ? BudgetFigure::kNoSeries
                                       : series_index(value, reader);
  return {{"series", std::to_string(series)}};
}

}  // namespace

ViewDescriptor budget_view() {
  ViewDescriptor d;
  d.name = "budget";
  d.title = "Head budgets";
  d.options = {{"series",
                "budget: a per-head series by name or index (default: the first *hot_budget* "
                "one; none: entries by tier)"}};
  d.parse = budget_options;
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return BudgetFigure::load(data, q.selection,
                              int(option_int(q.options, "series", BudgetFigure::kAutoSeries)));
  };
  d.widget = make_view<BudgetView>;
  d.controls = budget_controls;
  d.area = DockArea::Right;
  d.raised = true;
  d.share = {0.34, 0.3};
  return d;
}

}  // namespace kvscope::views
