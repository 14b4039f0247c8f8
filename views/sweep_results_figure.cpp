#include "views/sweep_results_figure.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "views/causal_heads_figure.h"
#include "views/pareto_figure.h"
#include "views/sweep_figure.h"

namespace kvscope::views {

namespace {

struct MetricSpec {
  SweepMetric metric;
  const char* name;
  const char* label;
};
const MetricSpec kMetrics[] = {
    {SweepMetric::Success, "success", "answer found"},
    {SweepMetric::Score, "score", "share of the answers found"},
    {SweepMetric::NeedleSurvival, "needle-survival", "needle survival"},
    {SweepMetric::Kl, "kl", "max KL(full ‖ policy)"},
    {SweepMetric::CausalSet, "causal-set",
     "share of the searched misses whose minimal set holds the head"},
};

const MetricSpec& spec_of(SweepMetric m) {
  for (const MetricSpec& s : kMetrics)
    if (s.metric == m) return s;
  throw std::logic_error("sweep metric without a name");
}

// "found", "missed", or for a multi-answer task found in part "missed (75 %
// of the answers found)".
QString answer_verdict(const sweep::ResultRow& r) {
  const int8_t success = int8_t(r.success.value_or(0));
  if (success == 1) return "found";
  const std::string partial = analysis::partial_answers(success, r.score.value_or(NAN));
  return partial.empty() ? "missed" : QString::fromStdString("missed (" + partial + ")");
}

}  // namespace

QString sweep_metric_name(SweepMetric m) {
  return spec_of(m).name;
}

QString sweep_metric_label(SweepMetric m) {
  return QString::fromUtf8(spec_of(m).label);
}

SweepMetric sweep_metric_from_name(const QString& name) {
  QStringList names;
  for (const MetricSpec& s : kMetrics) {
    if (name == s.name) return s.metric;
    names << s.name;
  }
  throw InputError("", "--metric",
                   "unknown sweep metric '" + name.toStdString() + "' (expected " +
                       names.join(", ").toStdString() + ")");
}

double sweep_metric_value(const sweep::ResultRow& r, SweepMetric m) {
  switch (m) {
    case SweepMetric::Success: return r.success ? double(*r.success) : NAN;
    case SweepMetric::Score: return r.score ? *r.score : r.success ? double(*r.success) : NAN;
    case SweepMetric::NeedleSurvival: return r.needle_survival();
    case SweepMetric::Kl: return r.max_kl.value_or(NAN);
    case SweepMetric::CausalSet:
      return r.causal_set_size && *r.causal_set_size >= 0 ? double(*r.causal_set_size) : NAN;
  }
  return NAN;
}

QString sweep_policy_label(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return QString::fromStdString(spec);
  std::string label = spec.substr(0, colon), params;
  size_t start = colon + 1;
  while (start <= spec.size()) {
    const size_t end = std::min(spec.find(',', start), spec.size());
    const std::string param = spec.substr(start, end - start);
    if (!param.empty() && param.rfind("gates=", 0) != 0)
      params += (params.empty() ? "" : ",") + param;
    start = end + 1;
  }
  return QString::fromStdString(params.empty() ? label : label + ":" + params);
}

QString sweep_task_label(const std::string& task) {
  std::string out = task;
  const size_t at = out.find("file=");
  if (at != std::string::npos && (at == 0 || out[at - 1] == ':' || out[at - 1] == ',')) {
    const size_t end = std::min(out.find(',', at), out.size());
    const std::string path = out.substr(at + 5, end - at - 5);
    const size_t slash = path.find_last_of('/');
    if (slash != std::string::npos) out.replace(at + 5, end - at - 5, path.substr(slash + 1));
  }
  return QString::fromStdString(out);
}

QString SweepResultsFigure::describe_cells(const std::vector<const sweep::ResultRow*>& cells,
                                           size_t limit) {
  QString tip;
  for (size_t i = 0; i < cells.size() && i < limit; ++i) {
    const sweep::ResultRow& r = *cells[i];
    QString where = QString("seed %1").arg(r.seed.value_or(0));
    if (r.tokens) where += QString(", %1 tokens").arg(*r.tokens);
    if (r.depth) where += QString(", depth %1").arg(*r.depth);
    tip += r.ok()
               ? QString("\n%1: %2, expected \"%3\", generated \"%4\"")
                     .arg(where, answer_verdict(r), QString::fromStdString(r.expected),
                          QString::fromStdString(r.generated).left(60))
               : QString("\n%1: failed: %2").arg(where, QString::fromStdString(r.error).left(80));
  }
  if (cells.size() > limit) tip += QString("\n… and %1 more cells").arg(cells.size() - limit);
  return tip;
}

const std::vector<SweepFigureKind>& sweep_figure_kinds() {
  using M = SweepMetric;
  static const std::vector<SweepFigureKind> kinds = {
      {"sweep",
       "grid (depth × length)",
       {M::Success, M::Score, M::NeedleSurvival},
       [](QString name, std::vector<sweep::ResultRow> rows, SweepMetric m) {
         return std::make_shared<SweepFigure>(std::move(name), std::move(rows), m);
       }},
      {"pareto",
       "against KV memory",
       {M::Score, M::Success, M::NeedleSurvival, M::Kl},
       [](QString name, std::vector<sweep::ResultRow> rows, SweepMetric m) {
         return std::make_shared<ParetoFigure>(std::move(name), std::move(rows), m);
       }},
      {"heads",
       "retrieval heads (causal search)",
       {M::CausalSet},
       [](QString name, std::vector<sweep::ResultRow> rows, SweepMetric m) {
         return std::make_shared<CausalHeadsFigure>(std::move(name), std::move(rows), m);
       }},
  };
  return kinds;
}

const SweepFigureKind* find_sweep_figure_kind(const std::string& name) {
  for (const SweepFigureKind& k : sweep_figure_kinds())
    if (name == k.name) return &k;
  return nullptr;
}

std::shared_ptr<SweepResultsFigure> make_sweep_figure(const std::string& kind, QString name,
                                                      std::vector<sweep::ResultRow> rows,
                                                      const QString& metric) {
  const SweepFigureKind* k = find_sweep_figure_kind(kind);
  if (!k) throw std::logic_error("no sweep figure kind '" + kind + "'");
  const SweepMetric m = metric.isEmpty() ? k->metrics.front() : sweep_metric_from_name(metric);
  if (std::find(k->metrics.begin(), k->metrics.end(), m) == k->metrics.end()) {
    QStringList names;
    for (SweepMetric x : k->metrics) names << sweep_metric_name(x);
    throw InputError("", "--metric",
                     "the " + kind + " view shows no '" + metric.toStdString() + "' (expected " +
                         names.join(", ").toStdString() + ")");
  }
  return k->make(std::move(name), std::move(rows), m);
}

}  // namespace kvscope::views
