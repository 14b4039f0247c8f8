#include "views/figure_factory.h"

#include "core/common/input_error.h"
#include "views/view_registry.h"

namespace kvscope::views {

QStringList figure_names() {
  QStringList names;
  for (const ViewDescriptor& d : view_registry()) names << d.name;
  return names;
}

std::shared_ptr<Figure> make_figure(TraceData& data, TraceData* compare, const FigureRequest& q) {
  if (const ViewDescriptor* d = find_view(q.view)) return d->figure(data, compare, q);
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
