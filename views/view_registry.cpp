#include "views/view_registry.h"

#include "core/common/input_error.h"
#include "views/heatmap_view.h"
#include "views/timeline_view.h"
#include "views/view_widgets.h"

namespace kvscope::views {

namespace {

std::shared_ptr<Figure> heatmap_figure(TraceData& data, TraceData*, const FigureRequest& q) {
  auto f = HeatmapFigure::load(data, q.selection, q.heatmap, q.pixels);
  if (!q.viewport.isEmpty()) {
    f->set_viewport(q.viewport);
    if (f->wants_detail(q.pixels))
      f->set_detail(HeatmapFigure::load_detail(data, f->layer, f->head, f->viewport(), q.pixels,
                                               f->block, f->dense_index));
  }
  return f;
}

std::function<std::shared_ptr<Figure>(TraceData&, TraceData*, const FigureRequest&)>
timeline_figure(TimelineMode mode) {
  return [mode](TraceData& data, TraceData*, const FigureRequest& q) {
    auto f = TimelineFigure::load(data, q.selection, mode);
    if (!q.viewport.isEmpty()) f->set_viewport(q.viewport);
    return std::shared_ptr<Figure>(f);
  };
}

std::shared_ptr<Figure> compare_figure(TraceData& data, TraceData* compare,
                                       const FigureRequest& q) {
  if (!compare)
    throw InputError(data.reader().path(), "--compare", "the compare view needs a second trace");
  return CompareFigure::load(data, *compare, q.selection);
}

// A widget factory for a view class constructed from (state, service).
template <typename View>
FigureWidget* make_view(CurrentState* state, TraceService* service) {
  return new View(state, service);
}

}  // namespace

const std::vector<ViewDescriptor>& view_registry() {
  using A = DockArea;
  static const std::vector<ViewDescriptor> all = {
      {"heatmap", "Attention", heatmap_figure, make_view<HeatmapView>, A::Central, "", false},
      {"overview", "Layers × heads",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return OverviewFigure::load(d, q.selection, q.metric);
       },
       make_view<OverviewView>, A::Left, "", true},
      {"timeline", "Eviction timeline", timeline_figure(TimelineMode::Head),
       [](CurrentState* s, TraceService* t) -> FigureWidget* {
         return new TimelineView(TimelineMode::Head, s, t);
       },
       A::Right, "", true},
      {"layers", "Heads holding tokens", timeline_figure(TimelineMode::Layers),
       [](CurrentState* s, TraceService* t) -> FigureWidget* {
         return new TimelineView(TimelineMode::Layers, s, t);
       },
       A::Right, "timeline", false},
      {"budget", "Head budgets",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return BudgetFigure::load(d, q.selection, q.budget_series);
       },
       make_view<BudgetView>, A::Right, "", true},
      {"survival", "Survival",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return SurvivalFigure::load(d, q.selection, q.horizon);
       },
       make_view<SurvivalView>, A::Right, "budget", false},
      {"cutoff", "Eviction cutoff",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return CutoffFigure::load(d, q.selection, q.series);
       },
       make_view<CutoffView>, A::Right, "budget", false},
      {"tokens", "Token text",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return TokensFigure::load(d, q.selection, q.coloring);
       },
       make_view<TokensView>, A::Bottom, "", true},
      {"history", "Token history",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return TokenHistoryFigure::load(d, q.selection);
       },
       make_view<HistoryView>, A::Bottom, "", true},
      {"forecast", "Forecast vs attention",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return ForecastFigure::load(d, q.selection, q.forecast_gate);
       },
       make_view<ForecastView>, A::Bottom, "history", false},
      {"gates", "Gate scores",
       [](TraceData& d, TraceData*, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return GatesFigure::load(d, q.selection, q.gate);
       },
       make_view<GatesView>, A::Bottom, "tokens", false},
      {"compare", "Compare", compare_figure, make_view<CompareView>, A::Bottom, "history", false},
      {"needle", "Needle",
       [](TraceData& d, TraceData* compare, const FigureRequest& q) -> std::shared_ptr<Figure> {
         return NeedleFigure::load(d, compare, q.selection);
       },
       make_view<NeedleView>, A::Bottom, "history", false},
  };
  return all;
}

const ViewDescriptor* find_view(const QString& name) {
  for (const ViewDescriptor& d : view_registry())
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace kvscope::views
