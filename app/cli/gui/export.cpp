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
#include <map>
#include <memory>

#include "app/cli/command.h"
#include "core/analysis/attention_lod.h"
#include "core/analysis/perfetto.h"
#include "core/common/atomic_file.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"
#include "core/sweep/results_table.h"
#include "views/figure_factory.h"
#include "views/sweep_results_figure.h"
#include "views/view_registry.h"

namespace kvscope::cli {

namespace {

struct ExportOptions {
  std::string trace, output, view = "heatmap", compare, zoom, preset;
  int layer = 0, head = 0;
  int64_t step = -1, token = -1;
  int width = 1600, height = 1000;
  double dpi = 150;
  bool build_lod = false;
  std::vector<int> perfetto_layers;
  views::ViewOptions given;  // the views' own options (their descriptors'), by name
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

// The sweep figures' --view names: "sweep, pareto or heads".
std::string sweep_views() {
  const auto& kinds = views::sweep_figure_kinds();
  std::string out;
  for (size_t i = 0; i < kinds.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + kinds[i].name;
  return out;
}

// --view sweep|pareto|heads (views::sweep_figure_kinds): TRACE is a sweep's folder
// (or its results.csv); the grid of every policy and task, or the score
// against the KV memory held, by --metric.
int run_sweep_export(const ExportOptions& o) {
  std::filesystem::path dir(o.trace);
  if (!std::filesystem::is_directory(dir)) dir = dir.parent_path();
  const std::string table = sweep::results_csv_path(dir.string());
  if (!std::filesystem::exists(table))
    throw InputError(
        o.trace, "TRACE",
        "--view " + o.view + " takes a sweep's output folder (with results.csv); none at " + table);
  for (const auto& [option, value] : o.given)
    if (option != "metric")
      throw InputError("", views::view_option_flag(option),
                       "the " + o.view + " view takes no " + views::view_option_flag(option) +
                           " (it takes --metric)");
  auto app = headless_app();
  const std::string name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  const std::shared_ptr<views::SweepResultsFigure> fig =
      views::make_sweep_figure(o.view, QString::fromStdString(name.empty() ? dir.string() : name),
                               sweep::read_results_csv(table),
                               QString::fromStdString(views::option_text(o.given, "metric", "")));
  if (const QString why = fig->missing_data(); !why.isEmpty())
    throw InputError(table, "--view " + o.view, why.toStdString());
  views::export_figure(*fig, QString::fromStdString(o.output), {o.width, o.height, o.dpi});
  std::cout << "wrote " << o.output << ": " << fig->title().toStdString() << "\n";
  return kExitOk;
}

// An option of another view (or of none, for perfetto) is refused by name.
void check_view_options(const ExportOptions& o) {
  const views::ViewDescriptor* d = views::find_view(QString::fromStdString(o.view));
  for (const auto& [name, value] : o.given) {
    bool own = false;
    if (d)
      for (const views::ViewOption& option : d->options) own = own || option.name == name;
    if (!own)
      throw InputError("", views::view_option_flag(name),
                       "the " + o.view + " view takes no " + views::view_option_flag(name) +
                           " (it is " + views::views_taking(name) + "'s)");
  }
}

// The figure of a registered view, as the GUI makes it: the request's
// options are the view's own, read against the trace by the view.
std::shared_ptr<views::Figure> export_view(const ExportOptions& o, views::TraceData& data,
                                           views::TraceData* compare) {
  const views::ViewDescriptor& d = *views::find_view(QString::fromStdString(o.view));
  const trace::TraceReader& reader = data.reader();
  views::FigureRequest q;
  q.view = d.name;
  q.selection = views::selection_for(reader, o.layer, o.head, o.step, o.token);
  q.options = d.parse ? d.parse(o.given, reader, q) : o.given;
  q.viewport = parse_zoom(o.zoom);
  const double scale = o.dpi / 96.0;
  q.pixels = QSizeF(o.width / scale * 0.85, o.height / scale * 0.85);
  return views::make_figure(data, compare, q);
}

int run_export(const ExportOptions& o) {
  check_output_path(o.output, "-o");
  if (views::find_sweep_figure_kind(o.view)) return run_sweep_export(o);
  const std::string metric = views::option_text(o.given, "metric");
  for (const views::SweepFigureKind& k : views::sweep_figure_kinds())
    for (views::SweepMetric m : k.metrics)
      if (views::sweep_metric_name(m).toStdString() == metric)
        throw InputError(
            "", "--metric",
            "'" + metric + "' is a sweep figure's metric (--view " + sweep_views() + ")");
  check_view_options(o);
  if (std::filesystem::is_directory(o.trace))
    throw InputError(o.trace, "TRACE",
                     "is a folder: a trace file is expected (a sweep folder "
                     "takes --view " +
                         sweep_views() + ")");
  auto reader = trace::TraceReader::open(o.trace);
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
  std::shared_ptr<views::Figure> fig = export_view(o, data, other_data.get());
  if (const QString why = fig->missing_data(); !why.isEmpty())
    throw InputError(o.trace, "--view " + o.view, why.toStdString());
  views::ExportOptions eo{o.width, o.height, o.dpi};
  views::export_figure(*fig, QString::fromStdString(o.output), eo);
  std::cout << "wrote " << o.output << ": " << fig->title().toStdString() << "\n";
  return kExitOk;
}

// One option per view option of any view (a flag, or text checked against
// its choices; --metric also takes the sweep's colourings), its help naming
// the views that take it.
void add_view_options(CLI::App* sub, ExportOptions* o) {
  std::map<std::string, std::vector<std::string>> choices;
  std::map<std::string, std::string> help;
  std::map<std::string, const views::ViewOption*> first;
  for (const views::ViewDescriptor& d : views::view_registry())
    for (const views::ViewOption& v : d.options) {
      for (const std::string& c : v.choices)
        if (std::find(choices[v.name].begin(), choices[v.name].end(), c) == choices[v.name].end())
          choices[v.name].push_back(c);
      help[v.name] += (help[v.name].empty() ? "" : "; ") + v.help;
      first.emplace(v.name, &v);
    }
  for (const views::SweepFigureKind& k : views::sweep_figure_kinds()) {
    std::string names;
    for (views::SweepMetric m : k.metrics) {
      const std::string n = views::sweep_metric_name(m).toStdString();
      if (std::find(choices["metric"].begin(), choices["metric"].end(), n) ==
          choices["metric"].end())
        choices["metric"].push_back(n);
      names += (names.empty() ? "" : ", ") + n;
    }
    help["metric"] += std::string("; ") + k.name + ": " + names + " (default " +
                      views::sweep_metric_name(k.metrics.front()).toStdString() + ")";
  }
  for (const auto& [name, spec] : first) {
    const std::string flag = views::view_option_flag(name), key = name;
    if (spec->flag) {
      sub->add_flag_function(
          flag, [o, key](int64_t) { o->given[key] = "true"; }, help[name]);
      continue;
    }
    CLI::Option* opt = sub->add_option_function<std::string>(
        flag, [o, key](const std::string& v) { o->given[key] = v; }, help[name]);
    if (!choices[name].empty()) opt->check(CLI::IsMember(choices[name]));
    if (spec->max > spec->min) opt->check(CLI::Range(spec->min, spec->max));
  }
}

Command add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand(
      "export", "Render a view to PNG/SVG/PDF, its data to CSV, or lifetimes to Perfetto JSON");
  sub->add_option("TRACE", o->trace,
                  "trace file (--view " + sweep_views() + ": a sweep's output folder)")
      ->required()
      ->check(CLI::ExistingPath);
  sub->add_option("-o,--output", o->output, "output: .png .svg .pdf .csv (or .json for perfetto)")
      ->required();
  std::vector<std::string> views_list;
  for (const QString& n : views::figure_names()) views_list.push_back(n.toStdString());
  views_list.push_back("perfetto");
  for (const views::SweepFigureKind& k : views::sweep_figure_kinds()) views_list.push_back(k.name);
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
  sub->add_option("--zoom", o->zoom, "heatmap: Q0:Q1,K0:K1 tokens; timeline: T0:T1,S0:S1");
  add_view_options(sub, o.get());
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
