// The one registry of views: name (`kvscope export --view NAME`), dock title,
// how the figure is made from a trace (the GUI's widgets and the headless
// export both go through it), the widget that shows it, and where the GUI
// docks it. Adding a view is its figure, its widget and one line in
// view_registry.cpp.
#pragma once

#include <QString>
#include <functional>
#include <memory>
#include <vector>

#include "views/figure_factory.h"

namespace kvscope::views {

class CurrentState;
class FigureWidget;
class TraceService;

enum class DockArea { Central, Left, Right, Bottom };

struct ViewDescriptor {
  QString name;   // --view NAME, dock object name "dock-NAME"
  QString title;  // the dock's title
  std::function<std::shared_ptr<Figure>(TraceData& data, TraceData* compare,
                                        const FigureRequest& request)>
      figure;
  std::function<FigureWidget*(CurrentState* state, TraceService* service)> widget;
  DockArea area = DockArea::Bottom;
  QString tab_with;     // tabbed with this earlier view's dock ("" = a dock of its own)
  bool raised = false;  // the tab shown first
};

const std::vector<ViewDescriptor>& view_registry();
const ViewDescriptor* find_view(const QString& name);

}  // namespace kvscope::views
