#include "app/gui/trace_info.h"

#include <QFileInfo>

#include <optional>

#include "core/analysis/deferred_retention.h"
#include "core/analysis/summary.h"
#include "core/analysis/why.h"

namespace kvscope::gui {

TraceInfoPanel::TraceInfoPanel(views::CurrentState* state, views::TraceService* service,
                               QWidget* parent)
    : QTextBrowser(parent), state_(state), service_(service) {
  setObjectName("info");
  state_->attach(this);
}

TraceInfoPanel::~TraceInfoPanel() {
  state_->detach(this);
}

void TraceInfoPanel::state_changed(const views::Selection&, uint32_t changes) {
  if (changes & (views::kTraceChanged | views::kTraceGrew)) reload();
}

void TraceInfoPanel::set_lod_status(const QString& trace, const QString& status) {
  lod_status_[trace] = status;
  if (trace.toStdString() == state_->selection().trace) show_body();
}

void TraceInfoPanel::show_body() {
  const QString status =
      lod_status_.value(QString::fromStdString(state_->selection().trace), "not built yet");
  setHtml(body_ + "<p><b>level-of-detail cache</b>: " + status.toHtmlEscaped() + "</p>");
}

void TraceInfoPanel::reload() {
  const views::Selection& sel = state_->selection();
  if (sel.trace.empty()) return;
  service_->request<QString>(
      sel.trace, "info", [](views::TraceData& d) { return describe(d); },
      [this](QString html) {
        body_ = html;
        show_body();
      },
      this, [this](QString e) { setPlainText(e); });
}

QString TraceInfoPanel::describe(views::TraceData& data) {
  const trace::TraceReader& r = data.reader();
  const trace::RunInfo& run = r.run();
  analysis::TraceSummary s = analysis::summarize(r);
  auto q = [](const std::string& v) { return QString::fromStdString(v).toHtmlEscaped(); };
  auto parenthesised = [&](const std::string& v) {
    return v.empty() ? QString() : " (" + q(v) + ")";
  };
  auto row = [](const QString& k, const QString& v) {
    return "<tr><td><b>" + k + "</b></td><td>" + v + "</td></tr>";
  };
  QString tiers;
  for (size_t t = 0; t < run.tier_names.size(); ++t)
    tiers += q(run.tier_names[t]) +
             (t < run.tier_formats.size() ? " (" + q(run.tier_formats[t]) + ")" : QString()) + " ";
  QString gates;
  for (const trace::GateSpec& g : r.layout().gates) gates += q(g.name) + " ";
  QString series;
  for (const trace::SeriesSpec& sp : r.series()) series += q(sp.name) + " ";
  QString html = "<h3>" + QFileInfo(QString::fromStdString(r.path())).fileName().toHtmlEscaped() +
                 "</h3><table>";
  html += row("file", q(r.path()) +
                          QString(" (%1 MiB)").arg(double(r.file_bytes()) / 1048576.0, 0, 'f', 1));
  html += row("complete", r.complete() ? "yes" : "no — capture running or interrupted");
  html += row("model", q(run.model.name) + " (" + q(run.model.architecture) +
                           QString("): %1 layers, %2 heads, %3 kv heads, head dim %4, %5 on %6")
                               .arg(run.model.n_layers)
                               .arg(run.model.n_heads)
                               .arg(run.model.n_kv_heads)
                               .arg(run.model.head_dim)
                               .arg(q(run.model.dtype))
                               .arg(q(run.model.device)));
  html += row("KV cache", q(run.model.kv_dtype) + " rows");
  html += row("layers", q(trace::layer_types_summary(run.model)));
  html += row("policy", q(run.policy));
  html += row("parameters", "<code>" + q(run.policy_params_json) + "</code>");
  html += row("budget", q(run.budget_kind) + " " + QString::number(run.budget));
  html += row("seed", QString::number(run.seed));
  html += row("capture", q(run.capture_levels));
  html += row("tiers", tiers);
  html += row("gates", gates.isEmpty() ? "none" : gates);
  html += row("series", series.isEmpty() ? "none" : series);
  html += row(
      "steps",
      QString("%1 (prefill %2, decode %3)").arg(s.steps).arg(s.prefill_steps).arg(s.decode_steps));
  html += row("tokens", QString::number(s.tokens));
  html += row("events", QString::number(s.events));
  html += row("format", QString("kvscope-trace v%1.%2, written by %3")
                            .arg(r.format_version())
                            .arg(r.format_minor_version())
                            .arg(q(r.writer())));
  html +=
      row("tool", q(run.tool_version) + ", created " +
                      (run.created_utc.empty() ? QString("(not recorded)") : q(run.created_utc)));
  html += row("finish", q(r.finish_reason()));
  if (!run.task_kind.empty()) {
    const int8_t success = r.task_success();
    html += row("task", q(run.task_kind) + ", expected: " + q(run.expected_answer) + " — " +
                            (success == 1   ? "<b>found</b>"
                             : success == 0 ? "<b>missed</b>"
                                            : "unfinished") +
                            parenthesised(analysis::partial_answers(success, r.task_score())));
    const std::string generated = r.generated_text();
    html += row("generated", "<code>" + q(generated.substr(0, 600)) +
                                 (generated.size() > 600 ? "…" : "") + "</code>");
  }
  if (std::optional<analysis::DeferredRetention> d = analysis::deferred_retention(r))
    html += row("deferred retention",
                QString("DRR %1 (%2 needle tokens, %3 needed steps from step %4); available at "
                        "every needed step: %5 % of (token, kv head) pairs")
                    .arg(d->rate, 0, 'f', 4)
                    .arg(d->needle_tokens)
                    .arg(d->needed_steps)
                    .arg(d->first_needed_step)
                    .arg(100.0 * d->always_share, 0, 'f', 1));
  html += row("command", "<code>" + q(run.command_line) + "</code>");
  html += "</table><p><b>prompt</b>: " + q(run.prompt.substr(0, 2000)) +
          (run.prompt.size() > 2000 ? "…" : "") + "</p>";
  return html;
}

}  // namespace kvscope::gui
