#include "views/gates_view.h"

#include "views/trace_choices.h"
#include "views/view_controls.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

GatesView::GatesView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("gates", state, service, parent) {}

void GatesView::set_gate(int gate) {
  set_option("gate", std::to_string(gate));
}

namespace {

// The trace's gates come with each loaded figure.
QWidget* gates_controls(FigureWidget* widget) {
  return figure_choice_row(
      static_cast<GatesView*>(widget), "gate", "gateCombo",
      [](GatesView* v, int i) { v->set_gate(std::max(0, i)); },
      [](GatesView* v, int* current) {
        *current = v->gates() ? std::max(0, v->gates()->gate) : 0;
        return v->gates() ? v->gates()->gate_names : QStringList();
      },
      "");
}

}  // namespace

ViewDescriptor gates_view() {
  ViewDescriptor d;
  d.name = "gates";
  d.title = "Gate scores";
  d.options = {{"gate", "gates: a gate by name or index (default: the first)"}};
  d.parse = [](const ViewOptions& given, const trace::TraceReader& reader,
               const FigureRequest&) -> ViewOptions {
    return {{"gate", std::to_string(gate_index(option_text(given, "gate", "0"), reader, false))}};
  };
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return GatesFigure::load(data, q.selection, int(option_int(q.options, "gate", 0)));
  };
  d.widget = make_view<GatesView>;
  d.controls = gates_controls;
  d.area = DockArea::Bottom;
  d.tab_with = "tokens";
  return d;
}

}  // namespace kvscope::views
