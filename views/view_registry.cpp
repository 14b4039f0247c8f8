#include "views/view_registry.h"

#include "core/common/check.h"
#include "views/view_descriptors.h"

namespace kvscope::views {

namespace {

// An option two views share means one thing on the command line.
void check_shared_options(const std::vector<ViewDescriptor>& all) {
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      KVSCOPE_CHECK(all[a].name != all[b].name,
                    "view registry: " + all[a].name.toStdString() + " twice");
      for (const ViewOption& x : all[a].options)
        for (const ViewOption& y : all[b].options)
          KVSCOPE_CHECK(x.name != y.name || (x.flag == y.flag && x.min == y.min && x.max == y.max),
                        "view registry: --" + x.name + " differs between " +
                            all[a].name.toStdString() + " and " + all[b].name.toStdString());
    }
}

}  // namespace

const std::vector<ViewDescriptor>& view_registry() {
  static const std::vector<ViewDescriptor> all = [] {
    std::vector<ViewDescriptor> v = {
        heatmap_view(),  overview_view(), timeline_view(), layers_view(),  budget_view(),
        survival_view(), cutoff_view(),   tokens_view(),   history_view(), forecast_view(),
        gates_view(),    compare_view(),  needle_view(),   causal_view(),
    };
    check_shared_options(v);
    return v;
  }();
  return all;
}

const ViewDescriptor* find_view(const QString& name) {
  for (const ViewDescriptor& d : view_registry())
    if (d.name == name) return &d;
  return nullptr;
}

std::string views_taking(const std::string& option) {
  std::string out;
  for (const ViewDescriptor& d : view_registry())
    for (const ViewOption& o : d.options)
      if (o.name == option) out += (out.empty() ? "" : ", ") + d.name.toStdString();
  return out;
}

}  // namespace kvscope::views
