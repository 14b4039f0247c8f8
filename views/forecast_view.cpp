#include "views/forecast_view.h"

#include <QMouseEvent>
#include <algorithm>

#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "views/trace_choices.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

ForecastView::ForecastView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("forecast", state, service, parent) {}

void ForecastView::set_gate(int gate) {
  set_option("gate", std::to_string(gate));
}

void ForecastView::follow(const Selection& sel) {
  if (ForecastFigure* f = forecast()) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    update();
  }
}

void ForecastView::state_changed(const Selection& sel, uint32_t changes) {
  if (changes & kStepChanged) follow(sel);
  FigureWidget::state_changed(sel, changes);
}

void ForecastView::adopt(std::shared_ptr<Figure>) {
  // The step may have moved while the figure loaded (no reload for that).
  follow(state_->selection());
}

void ForecastView::click_at(const QPointF& point) {
  ForecastFigure* f = forecast();
  if (!f || f->token < 0) return;
  int64_t s = f->step_at(area(), point);
  if (s < 0) return;
  f->step = s;
  update();
  state_->set_step(s, this);
}

void ForecastView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

namespace {

// The time-varying gates come with each loaded figure.
QWidget* forecast_controls(FigureWidget* widget) {
  return figure_choice_row(
      static_cast<ForecastView*>(widget), "gate", "forecastGateCombo",
      [](ForecastView* v, int i) {
        ForecastFigure* f = v->forecast();
        if (f && i >= 0 && size_t(i) < f->gate_choices.size())
          v->set_gate(f->gate_choices[size_t(i)]);
      },
      [](ForecastView* v, int* current) {
        ForecastFigure* f = v->forecast();
        QStringList names = f ? f->gate_choice_names : QStringList();
        if (f)
          for (size_t i = 0; i < f->gate_choices.size(); ++i)
            if (f->gate_choices[i] == f->gate) *current = int(i);
        return names;
      },
      "follows the selected token · click: select the step");
}

// It follows one token (--token); --gate, when given, must be time-varying.
ViewOptions forecast_options(const ViewOptions& given, const trace::TraceReader& reader,
                             const FigureRequest& q) {
  if (q.selection.tokens.empty())
    throw InputError(reader.path(), "--token",
                     "the forecast view follows one token: give --token T (0 <= T < " +
                         std::to_string(reader.n_tokens()) + ")");
  const std::string value = option_text(given, "gate");
  return {{"gate", value.empty() ? "-1" : std::to_string(gate_index(value, reader, true))}};
}

}  // namespace

ViewDescriptor forecast_view() {
  ViewDescriptor d;
  d.name = "forecast";
  d.title = "Forecast vs attention";
  d.options = {{"gate",
                "forecast: a time-varying gate by name or index (default: the first time-varying "
                "one)"}};
  d.parse = forecast_options;
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return ForecastFigure::load(data, q.selection, int(option_int(q.options, "gate", -1)));
  };
  d.widget = make_view<ForecastView>;
  d.controls = forecast_controls;
  d.area = DockArea::Bottom;
  d.tab_with = "history";
  return d;
}

}  // namespace kvscope::views
