// One entry point from a view name to its figure, shared by the GUI's
// widgets and the headless `kvscope export`.
#pragma once

#include <QRectF>
#include <QSizeF>
#include <QStringList>
#include <memory>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/trace_data.h"
#include "views/view_options.h"

namespace kvscope::views {

struct FigureRequest {
  QString view = "heatmap";
  Selection selection;
  ViewOptions options;      // the view's own (its descriptor's), by name
  QSizeF pixels{900, 700};  // plot size the figure is made for
  QRectF viewport;          // heatmap/timeline window (empty: everything)
};

// The registered views' names, in registry order (views/view_registry.cpp).
QStringList figure_names();

// Throws InputError for an unknown view or a compare without a second trace.
std::shared_ptr<Figure> make_figure(TraceData& data, TraceData* compare,
                                    const FigureRequest& request);

// A selection for `reader` with (layer, head, step, token) clamped into range;
// throws InputError naming the option when one is out of range.
Selection selection_for(const trace::TraceReader& reader, int layer, int head, int64_t step,
                        int64_t token);

}  // namespace kvscope::views
