// kvscope info TRACE [--check] [--json] | kvscope info --schema
#include <nlohmann/json.hpp>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "app/cli/command.h"
#include "core/analysis/deferred_retention.h"
#include "core/analysis/summary.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "core/trace/row_tables.h"
#include "core/trace/schema.h"
#include "core/trace/validate.h"

namespace kvscope::cli {

namespace {

struct InfoOptions {
  std::string trace;
  bool check = false;
  bool json = false;
  bool schema = false;
};

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream out;
  out << std::fixed << std::setprecision(u ? 1 : 0) << v << " " << units[u];
  return out.str();
}

// Every table of step rows, counted alike, and what some of them mean.
void add_tables(const trace::TraceReader& r, nlohmann::json& j) {
  const trace::RunInfo& run = r.run();
  // Every table of step rows (core/trace/row_tables.h), counted alike; the
  // summaries below add what some of them mean.
  nlohmann::json tables = nlohmann::json::object();
  for (const trace::RowTableSpec* t : trace::step_tables())
    tables[t->group.substr(1)] = r.table_row_count(t->group);
  j["tables"] = tables;
  int64_t needed = 0, not_needed = 0;
  double wait_s = 0;
  const std::vector<trace::StallRow> stalls = r.stalls();
  for (const trace::StallRow& st : stalls) {
    wait_s += double(st.wait_s);
    needed += st.needed == 1 ? 1 : 0;
    not_needed += st.needed == 0 ? 1 : 0;
  }
  j["stalls"] = {{"count", tables["stalls"]},
                 {"wait_s", wait_s},
                 {"needed", needed},
                 {"not_needed", not_needed}};
  const std::vector<trace::MergeRow> merges = r.merges();
  double merge_weight = 0;
  for (const trace::MergeRow& m : merges) merge_weight += double(m.weight);
  j["merges"] = {{"count", tables["merges"]},
                 {"mean_weight", merges.empty() ? 0.0 : merge_weight / double(merges.size())}};
  j["rerotations"] = {{"count", tables["rerotations"]}};
  {
    std::set<std::pair<int, int>> heads;
    for (const trace::KeyChannelRow& c : r.pruned_key_channels())
      heads.insert({c.layer, c.kv_head});
    j["key_channels"] = {{"pruned", tables["key_channels"]},
                         {"heads", heads.size()},
                         {"head_dim", run.model.head_dim}};
  }
}

// The task's outcome, and the needle's deferred retention where it applies.
void add_task(const trace::TraceReader& r, nlohmann::json& j) {
  const trace::RunInfo& run = r.run();
  if (!run.task_kind.empty())
    j["task"] = {
        {"kind", run.task_kind},
        {"expected_answer", run.expected_answer},
        {"success", r.task_success()},
        {"score", std::isnan(r.task_score()) ? nlohmann::json() : nlohmann::json(r.task_score())},
        {"answer_logprob",
         std::isnan(r.answer_logprob()) ? nlohmann::json() : nlohmann::json(r.answer_logprob())},
        {"answer_rank", r.answer_rank()}};
  // The scorer and the question's protocol, when the capture recorded them (run_json).
  if (j.contains("task")) {
    const nlohmann::json extra = nlohmann::json::parse(run.run_json, nullptr, false);
    for (const char* key : {"scorer", "query"})
      if (extra.is_object() && extra.contains(key) && extra[key].is_string())
        j["task"][key] = extra[key];
  }
  if (std::optional<analysis::DeferredRetention> d = analysis::deferred_retention(r))
    j["deferred_retention"] = {{"rate", d->rate},
                               {"layer_rate", d->layer_rate},
                               {"always_available_share", d->always_share},
                               {"needle_tokens", d->needle_tokens},
                               {"question_begin", d->question_begin},
                               {"first_needed_step", d->first_needed_step},
                               {"needed_steps", d->needed_steps},
                               {"checks", d->checks},
                               {"available", d->available},
                               {"available_by_promotion", d->promoted},
                               {"pairs", d->pairs},
                               {"pairs_always_available", d->pairs_always}};
}

nlohmann::json summary_json(const trace::TraceReader& r, const analysis::TraceSummary& s) {
  const trace::RunInfo& run = r.run();
  nlohmann::json j;
  j["trace"] = r.path();
  j["file_bytes"] = r.file_bytes();
  j["format"] = {{"name", trace::kFormatName},
                 {"version", r.format_version()},
                 {"minor_version", r.format_minor_version()},
                 {"writer", r.writer()}};
  j["complete"] = r.complete();
  j["finish_reason"] = r.finish_reason();
  j["model"] = {{"name", run.model.name},
                {"path", run.model.path},
                {"architecture", run.model.architecture},
                {"n_layers", run.model.n_layers},
                {"n_heads", run.model.n_heads},
                {"n_kv_heads", run.model.n_kv_heads},
                {"head_dim", run.model.head_dim},
                {"dtype", run.model.dtype},
                {"kv_dtype", run.model.kv_dtype},
                {"device", run.model.device},
                {"layer_window", run.model.layer_window},
                {"layer_ffn", run.model.layer_ffn},
                {"layer_types", trace::layer_types_summary(run.model)}};
  nlohmann::json params = nlohmann::json::parse(run.policy_params_json, nullptr, false);
  j["policy"] = {
      {"spec", run.policy},
      {"name", run.policy_name},
      {"params", params.is_discarded() ? nlohmann::json(run.policy_params_json) : params},
      {"budget_kind", run.budget_kind},
      {"budget", run.budget}};
  j["seed"] = run.seed;
  j["capture_levels"] = run.capture_levels;
  j["tiers"] = run.tier_names;
  j["tier_attended"] = r.tier_attended();  // one 0/1 flag per tier
  j["tier_formats"] = run.tier_formats;    // empty before minor version 8
  j["steps"] = {{"total", s.steps}, {"prefill", s.prefill_steps}, {"decode", s.decode_steps}};
  if (s.reconstruction_steps > 0) {
    j["steps"]["reconstruction"] = s.reconstruction_steps;
    j["steps"]["reconstruction_tokens"] = s.reconstruction_tokens;
  }
  nlohmann::json roles, kinds;
  for (int i = 0; i < trace::kTokenRoleCount; ++i)
    roles[trace::token_role_name(static_cast<trace::TokenRole>(i))] = s.tokens_by_role[size_t(i)];
  for (int i = 0; i < trace::kEventKindCount; ++i)
    kinds[trace::event_kind_name(static_cast<trace::EventKind>(i))] = s.events_by_kind[size_t(i)];
  j["tokens"] = {{"total", s.tokens}, {"by_role", roles}};
  j["events"] = {{"total", s.events}, {"by_kind", kinds}};
  j["cache"] = {{"final_entries", s.final_entries},
                {"final_kv_bytes", s.final_kv_bytes},
                {"peak_kv_bytes", s.peak_kv_bytes}};
  nlohmann::json gates = nlohmann::json::array();
  for (const trace::GateSpec& g : r.layout().gates) gates.push_back(g.name);
  j["gates"] = gates;
  nlohmann::json series = nlohmann::json::array();
  for (const trace::SeriesSpec& sp : r.series())
    series.push_back({{"name", sp.name}, {"meaning", sp.meaning}, {"units", sp.units}});
  j["series"] = series;
  j["wall_s"] = s.wall_s;
  add_tables(r, j);
  add_task(r, j);
  return j;
}

void print_tables(const nlohmann::json& j, std::ostream& o) {
  const auto& st = j["stalls"];
  o << "stalls    " << st["count"] << ", total wait " << std::setprecision(6)
    << st["wait_s"].get<double>() << " s";
  if (st["needed"].get<int64_t>() + st["not_needed"].get<int64_t>() > 0)
    o << " (oracle: " << st["needed"] << " needed, " << st["not_needed"] << " not)";
  o << "\n";
  if (j["merges"]["count"].get<int64_t>() > 0)
    o << "merges    " << j["merges"]["count"] << " entries folded into survivors, mean weight "
      << std::setprecision(4) << j["merges"]["mean_weight"].get<double>() << "\n";
  if (j["rerotations"]["count"].get<int64_t>() > 0)
    o << "rerotated " << j["rerotations"]["count"] << " kept keys moved to another RoPE position\n";
  if (j["key_channels"]["pruned"].get<int64_t>() > 0)
    o << "channels  " << j["key_channels"]["pruned"] << " key channels pruned over "
      << j["key_channels"]["heads"] << " (layer, kv head) pairs of "
      << j["key_channels"]["head_dim"] << " channels each\n";
  // A table with no summary line of its own: its count.
  static const std::set<std::string> summarised = {"stalls", "merges", "rerotations",
                                                   "key_channels", "reconstruction"};
  for (auto& [table, n] : j["tables"].items())
    if (!summarised.count(table) && n.get<int64_t>() > 0)
      o << std::left << std::setw(10) << table << std::right << n << " rows\n";
}

void print_task(const nlohmann::json& j, std::ostream& o) {
  if (j.contains("task")) {
    const nlohmann::json& t = j["task"];
    o << "task      " << t["kind"].get<std::string>() << ", expected \""
      << t["expected_answer"].get<std::string>() << "\", success " << t["success"];
    const std::string partial = analysis::partial_answers(
        t["success"].get<int8_t>(), t["score"].is_number() ? t["score"].get<double>() : NAN);
    if (!partial.empty()) o << " (" << partial << ")";
    if (t.contains("scorer") && t["score"].is_number())
      o << ", " << t["scorer"].get<std::string>() << " score " << std::setprecision(3)
        << t["score"].get<double>();
    if (t.contains("query")) o << ", question " << t["query"].get<std::string>();
    if (t["answer_logprob"].is_number())
      o << ", answer log p " << std::fixed << std::setprecision(3)
        << t["answer_logprob"].get<double>() << std::defaultfloat << " (first token rank "
        << t["answer_rank"].get<int64_t>() << ")";
    o << "\n";
  }
  if (j.contains("deferred_retention")) {
    const auto& d = j["deferred_retention"];
    o << "retention DRR " << std::setprecision(4) << d["rate"].get<double>() << " ("
      << d["needle_tokens"] << " needle tokens x "
      << d["pairs"].get<int64_t>() / d["needle_tokens"].get<int64_t>() << " kv heads x "
      << d["needed_steps"] << " needed steps from step " << d["first_needed_step"] << ", "
      << d["available_by_promotion"]
      << " by promotion); at every needed step: " << std::setprecision(1)
      << 100.0 * d["always_available_share"].get<double>() << " % of (token, head) pairs\n"
      << "          per layer:";
    for (const auto& v : d["layer_rate"]) o << " " << std::setprecision(3) << v.get<double>();
    o << "\n";
  }
}

void print_summary(const nlohmann::json& j, const std::string& generated) {
  auto& o = std::cout;
  const auto& m = j["model"];
  const auto& p = j["policy"];
  o << "trace     " << j["trace"].get<std::string>() << " (" << human_bytes(j["file_bytes"])
    << ")\n";
  o << "format    kvscope-trace v" << j["format"]["version"] << "." << j["format"]["minor_version"]
    << ", written by " << j["format"]["writer"].get<std::string>() << "\n";
  o << "complete  " << (j["complete"].get<bool>() ? "yes" : "no (capture running or interrupted)")
    << ", finish reason: " << j["finish_reason"].get<std::string>() << "\n";
  o << "model     " << m["name"].get<std::string>() << " (" << m["architecture"].get<std::string>()
    << "): " << m["n_layers"] << " layers, " << m["n_heads"] << " heads, " << m["n_kv_heads"]
    << " kv heads, head_dim " << m["head_dim"] << ", " << m["dtype"].get<std::string>() << " on "
    << m["device"].get<std::string>() << "\n";
  o << "layers    " << m["layer_types"].get<std::string>() << "\n";
  o << "policy    " << p["spec"].get<std::string>()
    << " (budget: " << p["budget_kind"].get<std::string>() << " " << p["budget"] << ")\n";
  o << "seed      " << j["seed"] << "\n";
  o << "capture   " << j["capture_levels"].get<std::string>() << "; tiers:";
  for (size_t t = 0; t < j["tiers"].size(); ++t)
    o << " " << j["tiers"][t].get<std::string>()
      << (j["tier_attended"][t].get<int>() ? "" : " (not attended)");
  o << "\n";
  if (!j["tier_formats"].empty()) {
    o << "storage   KV cache " << m["kv_dtype"].get<std::string>() << ";";
    for (size_t t = 0; t < j["tier_formats"].size(); ++t)
      o << (t ? ", " : " ") << j["tiers"][t].get<std::string>() << " "
        << j["tier_formats"][t].get<std::string>();
    o << "\n";
  }
  o << "steps     " << j["steps"]["total"] << " (prefill " << j["steps"]["prefill"] << ", decode "
    << j["steps"]["decode"]
    << (j["steps"].contains("reconstruction")
            ? ", reconstruction " + j["steps"]["reconstruction"].dump() + " feeding " +
                  j["steps"]["reconstruction_tokens"].dump() + " tokens"
            : std::string())
    << "), wall " << std::fixed << std::setprecision(3) << j["wall_s"].get<double>() << " s\n";
  o << "tokens    " << j["tokens"]["total"];
  for (auto& [role, n] : j["tokens"]["by_role"].items())
    if (n.get<int64_t>() > 0) o << ", " << role << " " << n;
  o << "\nevents    " << j["events"]["total"];
  for (auto& [kind, n] : j["events"]["by_kind"].items())
    if (n.get<int64_t>() > 0) o << ", " << kind << " " << n;
  o << "\ncache     " << j["cache"]["final_entries"] << " entries, "
    << human_bytes(j["cache"]["final_kv_bytes"]) << " at the end; peak "
    << human_bytes(j["cache"]["peak_kv_bytes"]) << "\n";
  if (!j["gates"].empty()) {
    o << "gates    ";
    for (const auto& g : j["gates"]) o << " " << g.get<std::string>();
    o << "\n";
  }
  if (!j["series"].empty()) {
    o << "series   ";
    for (const auto& sp : j["series"]) o << " " << sp["name"].get<std::string>();
    o << "\n";
  }
  print_tables(j, o);
  print_task(j, o);
  std::string text = generated.size() > 300 ? generated.substr(0, 300) + "..." : generated;
  o << "generated " << nlohmann::json(text).dump() << "\n";
}

int run_check(const InfoOptions& opt) {
  trace::ValidationReport report = trace::validate_trace(opt.trace);
  if (opt.json) {
    nlohmann::json j;
    j["trace"] = opt.trace;
    j["valid"] = report.ok();
    j["complete"] = report.complete;
    j["steps"] = report.n_steps;
    j["tokens"] = report.n_tokens;
    j["events"] = report.n_events;
    j["violations"] = nlohmann::json::array();
    for (const auto& v : report.violations)
      j["violations"].push_back({{"field", v.field}, {"message", v.message}});
    std::cout << j.dump(2) << "\n";
  } else if (report.ok()) {
    std::cout << "OK: " << opt.trace << " is a valid KVScope trace v" << trace::kFormatVersion
              << " (" << (report.complete ? "complete" : "incomplete") << ", " << report.n_steps
              << " steps, " << report.n_tokens << " tokens, " << report.n_events << " events)\n";
  } else {
    for (const auto& v : report.violations) std::cout << v.field << ": " << v.message << "\n";
    std::cout << "INVALID: " << opt.trace << ": " << report.violations.size()
              << " schema violation(s)\n";
  }
  return report.ok() ? kExitOk : kExitBadInput;
}

int run_info(const InfoOptions& opt) {
  if (opt.schema) {
    std::cout << trace::schema_markdown();
    return kExitOk;
  }
  if (opt.trace.empty()) throw InputError("", "TRACE", "a trace file is required (or --schema)");
  if (opt.check) return run_check(opt);
  auto reader = trace::TraceReader::open(opt.trace);
  analysis::TraceSummary s = analysis::summarize(*reader);
  nlohmann::json j = summary_json(*reader, s);
  if (opt.json) {
    j["generated_text"] = reader->generated_text();
    std::cout << j.dump(2) << "\n";
  } else {
    print_summary(j, reader->generated_text());
  }
  return kExitOk;
}

}  // namespace

namespace {
Command add_info_command(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  CLI::App* sub = app.add_subcommand("info", "Summarise a trace; with --check validate it fully");
  sub->add_option("TRACE", opt->trace, "trace file (.kvtrace.h5)");
  sub->add_flag("--check", opt->check,
                "validate every dataset against the v1 schema and list each violation by path");
  sub->add_flag("--json", opt->json, "print JSON instead of text");
  sub->add_flag("--schema", opt->schema, "print the trace format v1 schema as Markdown");
  return {sub, [opt] { return run_info(*opt); }};
}
}  // namespace

KVSCOPE_REGISTER_COMMAND("info", add_info_command);

}  // namespace kvscope::cli
