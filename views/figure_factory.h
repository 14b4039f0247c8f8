// One entry point from a view name to its figure, shared by the GUI's export
// menu and the headless `kvscope export`.
#pragma once

#include <QRectF>
#include <QSizeF>
#include <QStringList>
#include <memory>

#include "views/budget_figure.h"
#include "views/compare_figure.h"
#include "views/cutoff_figure.h"
#include "views/forecast_figure.h"
#include "views/gates_figure.h"
#include "views/heatmap_figure.h"
#include "views/overview_figure.h"
#include "views/survival_figure.h"
#include "views/timeline_figure.h"
#include "views/tokens_figure.h"

namespace kvscope::views {

struct FigureRequest {
  QString view = "heatmap";
  Selection selection;
  HeatmapOptions heatmap;
  TokenColoring coloring = TokenColoring::AllHeads;
  OverviewMetric metric = OverviewMetric::Head;
  int gate = 0;
  int series = 0;                                 // cutoff: index into the trace's /series
  int budget_series = BudgetFigure::kAutoSeries;  // budget: a /series index, auto or none
  int forecast_gate = -1;  // forecast: index into the trace's gates (-1: first time-varying)
  int64_t horizon = -1;
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
