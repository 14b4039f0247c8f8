// The one registry of views. A view's descriptor carries everything about
// it: its name (`kvscope export --view NAME`) and dock title, its own
// options (the export's `--NAME` options, parsed against the trace by the
// view), how its figure is made from a request (the GUI's widgets and the
// headless export call the same function), its widget, its options row and
// where the GUI docks it. A view is its figure file, its view file (widget,
// controls, descriptor) and one line each in view_descriptors.h and
// view_registry.cpp (docs/architecture.md, "Adding things").
#pragma once

#include <QSizeF>
#include <QString>
#include <functional>
#include <memory>
#include <vector>

#include "views/figure_factory.h"
#include "views/view_options.h"

class QWidget;

namespace kvscope::trace {
class TraceReader;
}

namespace kvscope::views {

class CurrentState;
class FigureWidget;
class TraceService;

enum class DockArea { Central, Left, Right, Bottom };

struct ViewDescriptor {
  QString name;   // --view NAME, dock object name "dock-NAME"
  QString title;  // the dock's title
  // Its own options, and how it reads those given on the command line
  // against the trace into the request's options (null: as given); throws
  // InputError naming the option.
  std::vector<ViewOption> options;
  std::function<ViewOptions(const ViewOptions& given, const trace::TraceReader& reader,
                            const FigureRequest& request)>
      parse;
  std::function<std::shared_ptr<Figure>(TraceData& data, TraceData* compare,
                                        const FigureRequest& request)>
      figure;
  std::function<FigureWidget*(CurrentState* state, TraceService* service)> widget;
  // Its options row above it in the GUI (null: none).
  std::function<QWidget*(FigureWidget* view)> controls;
  DockArea area = DockArea::Bottom;
  QString tab_with;        // tabbed with this earlier view's dock ("" = a dock of its own)
  bool raised = false;     // the tab shown first
  QSizeF share;            // the dock's first width and height, shares of the window (0: Qt's)
  bool reads_lod = false;  // reloads when the trace's level-of-detail cache arrives
};

const std::vector<ViewDescriptor>& view_registry();
const ViewDescriptor* find_view(const QString& name);
// The views that take an option, comma-separated (for messages and help).
std::string views_taking(const std::string& option);

}  // namespace kvscope::views
