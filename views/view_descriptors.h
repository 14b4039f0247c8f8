// Each view's descriptor, defined in the view's own file; view_registry.cpp
// lists them in the GUI's docking order.
#pragma once

#include "views/view_registry.h"

namespace kvscope::views {

ViewDescriptor heatmap_view();   // heatmap_view.cpp
ViewDescriptor overview_view();  // overview_view.cpp
ViewDescriptor timeline_view();  // timeline_view.cpp
ViewDescriptor layers_view();    // timeline_view.cpp
ViewDescriptor budget_view();    // budget_view.cpp
ViewDescriptor survival_view();  // survival_view.cpp
ViewDescriptor cutoff_view();    // cutoff_view.cpp
ViewDescriptor tokens_view();    // tokens_view.cpp
ViewDescriptor history_view();   // history_view.cpp
ViewDescriptor forecast_view();  // forecast_view.cpp
ViewDescriptor gates_view();     // gates_view.cpp
ViewDescriptor compare_view();   // compare_view.cpp
ViewDescriptor needle_view();    // needle_view.cpp
ViewDescriptor causal_view();    // causal_view.cpp

// A widget factory for a view class constructed from (state, service).
template <typename View>
FigureWidget* make_view(CurrentState* state, TraceService* service) {
  return new View(state, service);
}

}  // namespace kvscope::views
