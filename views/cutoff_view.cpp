#include "views/cutoff_view.h"

#include <QMouseEvent>
#include <algorithm>
#include <cmath>

#include "views/trace_choices.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

CutoffView::CutoffView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("cutoff", state, service, parent) {}

void CutoffView::set_series(int series) {
  set_option("series", std::to_string(series));
}

void CutoffView::follow(const Selection& sel) {
  if (CutoffFigure* f = cutoff()) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    f->selected_token = sel.token();
    update();
  }
}

void CutoffView::state_changed(const Selection& sel, uint32_t changes) {
  if (changes & (kStepChanged | kTokensChanged)) follow(sel);
  FigureWidget::state_changed(sel, changes);
}

void CutoffView::adopt(std::shared_ptr<Figure>) {
  // The step may have moved while the figure loaded (no reload for that).
  follow(state_->selection());
}

void CutoffView::click_at(const QPointF& point) {
  CutoffFigure* f = cutoff();
  if (!f || f->series < 0) return;
  int64_t i = f->decision_at(area(), point);
  if (i >= 0) {
    const CutoffFigure::Decision& d = f->decisions[size_t(i)];
    f->selected_token = d.token;
    f->step = d.step;
    update();
    state_->set_tokens({int64_t(d.token)}, this);
    state_->set_step(d.step, this);
    return;
  }
  QRectF plot = f->layout(area()).plot;
  if (!plot.contains(point) || f->n_steps == 0) return;
  f->step = std::clamp<int64_t>(std::llround(f->x_map(plot).inverse(point.x())), 0, f->n_steps - 1);
  update();
  state_->set_step(f->step, this);
}

void CutoffView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

namespace {

// The names come with each loaded figure (the trace's /series); the choice
// is offered only when there is one to make.
QWidget* cutoff_controls(FigureWidget* widget) {
  return figure_choice_row(
      static_cast<CutoffView*>(widget), "series", "seriesCombo",
      [](CutoffView* v, int i) { v->set_series(std::max(0, i)); },
      [](CutoffView* v, int* current) {
        *current = v->cutoff() ? std::max(0, v->cutoff()->series) : 0;
        return v->cutoff() ? v->cutoff()->series_names : QStringList();
      },
      "click: a decision selects its token and step; elsewhere, the step");
}

}  // namespace

ViewDescriptor cutoff_view() {
  ViewDescriptor d;
  d.name = "cutoff";
  d.title = "Eviction cutoff";
  d.options = {{"series", "cutoff: a series by name or index (default: the first)"}};
  d.parse = [](const ViewOptions& given, const trace::TraceReader& reader,
               const FigureRequest&) -> ViewOptions {
    const std::string value = option_text(given, "series");
    return {{"series", value.empty() ? "0" : std::to_string(series_index(value, reader))}};
  };
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return CutoffFigure::load(data, q.selection, int(option_int(q.options, "series", 0)));
  };
  d.widget = make_view<CutoffView>;
  d.controls = cutoff_controls;
  d.area = DockArea::Right;
  d.tab_with = "budget";
  return d;
}

}  // namespace kvscope::views
