// kvscope export TRACE --view VIEW [--layer L --head H --step S ...] -o FILE
//
// Renders a view headless — the same figure code the GUI paints — to PNG,
// SVG or PDF (by extension), its data to CSV, or token lifetimes to
// Perfetto / Chrome trace-event JSON (--view perfetto, -o *.json). Needs no
// display: Qt runs on its offscreen platform.
#include <sys/stat.h>
#include <unistd.h>
#include <QGuiApplication>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "app/cli/command.h"
#include "core/analysis/attention_lod.h"
#include "core/analysis/perfetto.h"
#include "core/common/atomic_file.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"
#include "core/sweep/results_table.h"
#include "views/figure_factory.h"
#include "views/sweep_figure.h"

namespace kvscope::cli {

namespace {

struct ExportOptions {
  std::string trace, output, view = "heatmap", compare, colormap = "viridis", zoom, preset;
  int layer = 0, head = 0;
  int64_t step = -1, token = -1, horizon = -1;
  int width = 1600, height = 1000;
  double dpi = 150;
  bool linear = false, max = false, no_evicted = false, build_lod = false;
  std::string coloring = "all", metric = "head", series, gate;
  std::vector<int> perfetto_layers;
};

// Headless Qt: fonts and painting without a display server.
std::unique_ptr<QGuiApplication> headless_app() {
  if (QGuiApplication::instance()) return nullptr;
  setenv("QT_QPA_PLATFORM", "offscreen", 1);
  if (!getenv("XDG_RUNTIME_DIR")) {  // Qt warns without one; a private temp dir will do
    std::string dir = "/tmp/kvscope-runtime-" + std::to_string(getuid());
    mkdir(dir.c_str(), 0700);
    setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  }
  static int argc = 1;
  static char name[] = "kvscope";
  static char* argv[] = {name, nullptr};
  return std::make_unique<QGuiApplication>(argc, argv);
}

// --metric values: the overview's metric names with '-' for ' ', the first
// word of "head index" and "lost mass (oracle)".
std::vector<std::string> overview_metric_options() {
  std::vector<std::string> out;
  for (QString name : views::overview_metric_names()) {
    name = name.section(" (", 0, 0);
    if (name == "head index") name = "head";
    out.push_back(name.replace(' ', '-').toStdString());
  }
  return out;
}

// "q0:q1,k0:k1" in tokens (heatmap) or "s0:s1,t0:t1" (timeline).
QRectF parse_zoom(const std::string& z) {
  if (z.empty()) return {};
  double a, b, c, d;
  if (std::sscanf(z.c_str(), "%lf:%lf,%lf:%lf", &a, &b, &c, &d) != 4 || b <= a || d <= c)
    throw InputError("", "--zoom", "'" + z + "' is not Y0:Y1,X0:X1 with Y1 > Y0 and X1 > X0");
  return QRectF(c, a, d - c, b - a);  // x = second pair, y = first pair
}

int run_perfetto(const ExportOptions& o, const trace::TraceReader& reader) {
  analysis::PerfettoOptions po;
  po.layers = o.perfetto_layers;
  for (int l : po.layers)
    if (l < 0 || l >= reader.n_layers())
      throw InputError(reader.path(), "--layers", std::to_string(l) + " is not a layer");
  int64_t n = 0;
  write_stream_atomically(
      o.output, [&](std::ostream& out) { n = analysis::write_perfetto_json(reader, po, out); },
      "the Perfetto trace");
  std::cout << "wrote " << o.output << " (" << n << " trace events)\n";
  return kExitOk;
}

// A name or a small index into `names` (-1: neither).
int name_or_index(const std::string& value, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == value) return int(i);
  if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos &&
      value.size() < 9)
    return std::stoi(value);
  return -1;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// --series: a name of the trace's /series or its index. "": the first for
// the cutoff view, for the budget view the first "*hot_budget*" one; the
// budget view also takes "none" (entries by tier).
int series_option(const std::string& value, const std::string& view,
                  const trace::TraceReader& reader) {
  if (value.empty()) return view == "budget" ? views::BudgetFigure::kAutoSeries : 0;
  if (view == "budget" && value == "none") return views::BudgetFigure::kNoSeries;
  std::vector<std::string> names;
  for (const trace::SeriesSpec& s : reader.series()) names.push_back(s.name);
  int index = name_or_index(value, names);
  if (index >= 0 && index < static_cast<int>(names.size())) return index;
  throw InputError(
      reader.path(), "--series",
      "'" + value + "' is not a series of the trace (its series: " + joined(names) + ")");
}

// --gate: a name of the trace's /gates or its index. "": gate 0 for the
// gates view; for the forecast view the first time-varying gate, and a
// named one must be time-varying (have per-step samples).
int gate_option(std::string value, const std::string& view, const trace::TraceReader& reader) {
  const std::vector<trace::GateSpec>& gates = reader.layout().gates;
  std::vector<std::string> names, varying;
  for (const trace::GateSpec& g : gates) {
    names.push_back(g.name);
    if (g.time_varying) varying.push_back(g.name);
  }
  if (value.empty() && view == "forecast") return -1;
  if (value.empty() && view != "gates") return 0;
  if (value.empty()) value = "0";  // the gates view needs a gate
  int index = name_or_index(value, names);
  const bool number = value.find_first_not_of("0123456789") == std::string::npos;
  if (index < 0 || index >= static_cast<int>(names.size())) {
    if (number)
      throw InputError(reader.path(), "--gate",
                       value + " is outside [0, " + std::to_string(names.size()) +
                           ") (the trace's gates: /gates)");
    throw InputError(
        reader.path(), "--gate",
        "'" + value + "' is not a gate of the trace (its gates: " + joined(names) + ")");
  }
  if (view == "forecast" && !gates[size_t(index)].time_varying)
    throw InputError(
        reader.path(), "--gate",
        "'" + names[size_t(index)] +
            "' has no per-step samples (the trace's time-varying gates: " + joined(varying) + ")");
  return index;
}

// --view sweep: TRACE is a sweep's folder (or its results.csv); the grid of
// every policy and task, coloured by --metric success, score or needle-survival.
int run_sweep_export(const ExportOptions& o) {
  std::filesystem::path dir(o.trace);
  if (!std::filesystem::is_directory(dir)) dir = dir.parent_path();
  const std::string table = sweep::results_csv_path(dir.string());
  if (!std::filesystem::exists(table))
    throw InputError(
        o.trace, "TRACE",
        "--view sweep takes a sweep's output folder (with results.csv); none at " + table);
  const std::string metric = o.metric == "head" ? "success" : o.metric;
  const views::SweepFigure::Metric m =
      views::SweepFigure::metric_from_name(QString::fromStdString(metric));
  auto app = headless_app();
  const std::string name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  views::SweepFigure fig(QString::fromStdString(name.empty() ? dir.string() : name),
                         sweep::read_results_csv(table), m);
  views::export_figure(fig, QString::fromStdString(o.output), {o.width, o.height, o.dpi});
  std::cout << "wrote " << o.output << ": " << fig.title().toStdString() << "\n";
  return kExitOk;
}

int run_export(const ExportOptions& o) {
  check_output_path(o.output, "-o");
  if (o.view == "sweep") return run_sweep_export(o);
  if (views::SweepFigure::metric_names().contains(QString::fromStdString(o.metric)))
    throw InputError("", "--metric", "'" + o.metric + "' colours the sweep view only");
  if (std::filesystem::is_directory(o.trace))
    throw InputError(o.trace, "TRACE",
                     "is a folder: a trace file is expected (a sweep folder "
                     "takes --view sweep)");
  auto reader = trace::TraceReader::open(o.trace);
  const int gate = gate_option(o.gate, o.view, *reader);
  const int series = series_option(o.series, o.view, *reader);
  if (o.view == "forecast" && o.token < 0)
    throw InputError(o.trace, "--token",
                     "the forecast view follows one token: give --token T (0 <= T < " +
                         std::to_string(reader->n_tokens()) + ")");
  if (o.view == "perfetto") return run_perfetto(o, *reader);
  auto app = headless_app();
  views::TraceData data(*reader);
  if (reader->complete() && reader->layout().pooled_block > 0) {
    std::string cache = analysis::AttentionLod::default_cache_path(o.trace);
    std::shared_ptr<analysis::AttentionLod> lod =
        o.build_lod ? analysis::AttentionLod::open_or_build(*reader, cache)
                    : analysis::AttentionLod::open(*reader, cache);
    data.set_lod(lod);
  }
  std::unique_ptr<trace::TraceReader> other;
  std::unique_ptr<views::TraceData> other_data;
  if (!o.compare.empty()) {
    other = trace::TraceReader::open(o.compare);
    other_data = std::make_unique<views::TraceData>(*other);
  }
  views::FigureRequest q;
  q.view = QString::fromStdString(o.view);
  q.selection = views::selection_for(*reader, o.layer, o.head, o.step, o.token);
  q.heatmap.map = views::color_map_from_name(QString::fromStdString(o.colormap));
  q.heatmap.log = !o.linear;
  q.heatmap.use_max = o.max;
  q.heatmap.show_evicted = !o.no_evicted;
  static const std::map<std::string, views::TokenColoring> colorings = {
      {"all", views::TokenColoring::AllHeads},
      {"layer", views::TokenColoring::Layer},
      {"head", views::TokenColoring::Head},
      {"score", views::TokenColoring::Score}};
  q.coloring = colorings.at(o.coloring);
  const std::vector<std::string> metrics = overview_metric_options();
  q.metric =
      views::OverviewMetric(std::find(metrics.begin(), metrics.end(), o.metric) - metrics.begin());
  q.gate = std::max(0, gate);
  q.forecast_gate = gate;
  q.series = std::max(0, series);
  q.budget_series = series;
  q.horizon = o.horizon;
  q.viewport = parse_zoom(o.zoom);
  double scale = o.dpi / 96.0;
  q.pixels = QSizeF(o.width / scale * 0.85, o.height / scale * 0.85);
  std::shared_ptr<views::Figure> fig = views::make_figure(data, other_data.get(), q);
  views::ExportOptions eo{o.width, o.height, o.dpi};
  views::export_figure(*fig, QString::fromStdString(o.output), eo);
  std::cout << "wrote " << o.output << ": " << fig->title().toStdString() << "\n";
  return kExitOk;
}

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand(
      "export", "Render a view to PNG/SVG/PDF, its data to CSV, or lifetimes to Perfetto JSON");
  sub->add_option("TRACE", o->trace, "trace file (--view sweep: a sweep's output folder)")
      ->required()
      ->check(CLI::ExistingPath);
  sub->add_option("-o,--output", o->output, "output: .png .svg .pdf .csv (or .json for perfetto)")
      ->required();
  std::vector<std::string> views_list;
  for (const QString& n : views::figure_names()) views_list.push_back(n.toStdString());
  views_list.push_back("perfetto");
  views_list.push_back("sweep");
  sub->add_option("--view", o->view, "view to render")->check(CLI::IsMember(views_list));
  // Indices are checked against the trace once it is open (selection_for).
  const CLI::Range index(0, INT32_MAX);
  sub->add_option("--layer", o->layer, "layer")->check(index);
  sub->add_option("--head", o->head, "query head (its kv head follows)")->check(index);
  sub->add_option("--step", o->step, "step (default: the last)")->check(index);
  sub->add_option("--token", o->token, "selected token (history and forecast views)")->check(index);
  sub->add_option("--compare", o->compare, "second trace (compare view)")->check(CLI::ExistingFile);
  CLI::Option* width = sub->add_option("--width", o->width, "width in pixels (at --dpi)")
                           ->check(CLI::Range(16, 20000));
  CLI::Option* height = sub->add_option("--height", o->height, "height in pixels (at --dpi)")
                            ->check(CLI::Range(16, 20000));
  CLI::Option* dpi =
      sub->add_option("--dpi", o->dpi, "dots per inch: PDF/SVG page size is width/dpi inches")
          ->check(finite_range(10, 2400));
  std::vector<std::string> presets;
  std::string preset_help = "page for a paper or a talk, text at 8 pt on it:";
  for (const views::ExportPreset& p : views::export_presets()) {
    presets.push_back(p.name);
    preset_help += std::string(" ") + p.name + " (" + p.description + ");";
  }
  sub->add_option("--preset", o->preset,
                  preset_help + " --width, --height and --dpi given as well override it")
      ->check(CLI::IsMember(presets));
  sub->add_option("--colormap", o->colormap, "viridis, magma, cividis or grey")
      ->check(CLI::IsMember({"viridis", "magma", "cividis", "grey"}));
  sub->add_flag("--linear", o->linear, "heatmap: linear colour scale (default log)");
  sub->add_flag("--max", o->max, "heatmap: pooled max instead of mean");
  sub->add_flag("--no-evicted", o->no_evicted, "heatmap: do not mark keys no longer held");
  sub->add_option("--zoom", o->zoom, "heatmap: Q0:Q1,K0:K1 tokens; timeline: T0:T1,S0:S1");
  sub->add_option("--coloring", o->coloring, "tokens: all, layer, head or score")
      ->check(CLI::IsMember({"all", "layer", "head", "score"}));
  std::vector<std::string> metrics = overview_metric_options();
  for (const QString& m : views::SweepFigure::metric_names()) metrics.push_back(m.toStdString());
  sub->add_option("--metric", o->metric,
                  "overview sort: head, sink-mass, local-mass, entropy, entries-held, lost-mass; "
                  "sweep colour: success (default), score or needle-survival")
      ->check(CLI::IsMember(metrics));
  sub->add_option("--gate", o->gate,
                  "gates, forecast: gate name or index (default: the first; forecast: the first "
                  "time-varying gate)");
  sub->add_option("--series", o->series,
                  "cutoff, budget: series name or index (default: cutoff the first, budget the "
                  "first *hot_budget* one; budget: none shows entries by tier)");
  sub->add_option("--horizon", o->horizon, "survival: horizon h for the per-head map")
      ->check(CLI::Range(1, INT32_MAX));
  sub->add_option("--layers", o->perfetto_layers, "perfetto: layers to include (default all)");
  sub->add_flag(
      "--build-lod", o->build_lod,
      "build the level-of-detail cache beside the trace when missing (else read level 0)");
  return {sub, [o, width, height, dpi] {
            if (!o->preset.empty()) {
              const views::ExportOptions page = views::export_preset(o->preset);
              if (width->count() == 0) o->width = page.width;
              if (height->count() == 0) o->height = page.height;
              if (dpi->count() == 0) o->dpi = page.dpi;
            }
            return run_export(*o);
          }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("export", add_export_command);

}  // namespace kvscope::cli
