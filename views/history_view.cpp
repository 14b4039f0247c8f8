#include "views/history_view.h"

#include "views/view_descriptors.h"

namespace kvscope::views {

HistoryView::HistoryView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("history", state, service, parent) {}

ViewDescriptor history_view() {
  ViewDescriptor d;
  d.name = "history";
  d.title = "Token history";
  d.figure = [](TraceData& data, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
    return TokenHistoryFigure::load(data, q.selection);
  };
  d.widget = make_view<HistoryView>;
  d.area = DockArea::Bottom;
  d.raised = true;
  d.share = {0.5, 0.3};
  return d;
}

}  // namespace kvscope::views
