#include "views/figure_factory.h"

#include "core/common/input_error.h"

namespace kvscope::views {

QStringList figure_names() {
  return {"heatmap", "timeline", "layers",  "budget",  "survival",
          "gates",   "tokens",   "history", "compare", "overview"};
}

std::shared_ptr<Figure> make_figure(TraceData& data, TraceData* compare, const FigureRequest& q) {
  const Selection& sel = q.selection;
  if (q.view == "heatmap") {
    auto f = HeatmapFigure::load(data, sel, q.heatmap, q.pixels);
    if (!q.viewport.isEmpty()) {
      f->set_viewport(q.viewport);
      if (f->wants_detail(q.pixels))
        f->set_detail(HeatmapFigure::load_detail(data, f->layer, f->head, f->viewport(), q.pixels,
                                                 f->block, f->dense_index));
    }
    return f;
  }
  if (q.view == "timeline" || q.view == "layers") {
    auto f = TimelineFigure::load(data, sel,
                                  q.view == "timeline" ? TimelineMode::Head : TimelineMode::Layers);
    if (!q.viewport.isEmpty()) f->set_viewport(q.viewport);
    return f;
  }
  if (q.view == "budget") return BudgetFigure::load(data, sel);
  if (q.view == "survival") return SurvivalFigure::load(data, sel, q.horizon);
  if (q.view == "gates") return GatesFigure::load(data, sel, q.gate);
  if (q.view == "tokens") return TokensFigure::load(data, sel, q.coloring);
  if (q.view == "history") return TokenHistoryFigure::load(data, sel);
  if (q.view == "overview") return OverviewFigure::load(data, sel, q.metric);
  if (q.view == "compare") {
    if (!compare)
      throw InputError(data.reader().path(), "--compare", "the compare view needs a second trace");
    return CompareFigure::load(data, *compare, sel);
  }
  throw InputError("", "--view",
                   "unknown view '" + q.view.toStdString() +
                       "' (expected one of: " + figure_names().join(", ").toStdString() + ")");
}

Selection selection_for(const trace::TraceReader& r, int layer, int head, int64_t step,
                        int64_t token) {
  auto check = [&](const char* name, int64_t v, int64_t n) {
    if (v < 0 || v >= n)
      throw InputError(r.path(), name,
                       std::to_string(v) + " is outside [0, " + std::to_string(n) + ")");
  };
  check("--layer", layer, r.n_layers());
  check("--head", head, r.n_heads());
  if (r.n_steps() == 0) throw InputError(r.path(), "/steps", "the trace has no committed step yet");
  if (step < 0) step = r.n_steps() - 1;
  check("--step", step, r.n_steps());
  if (token >= 0) check("--token", token, r.n_tokens());
  Selection s;
  s.trace = r.path();
  s.layer = layer;
  s.head = head;
  s.step = step;
  if (token >= 0) s.tokens = {token};
  s.n_layers = r.n_layers();
  s.n_heads = r.n_heads();
  s.n_kv_heads = r.n_kv_heads();
  s.n_steps = r.n_steps();
  s.n_tokens = r.n_tokens();
  return s;
}

}  // namespace kvscope::views
