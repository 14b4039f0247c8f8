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
#include <fstream>
#include <iostream>
#include <memory>

#include "app/cli/command.h"
#include "core/analysis/attention_lod.h"
#include "core/analysis/perfetto.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"
#include "views/figure_factory.h"

namespace kvscope::cli {

namespace {

struct ExportOptions {
  std::string trace, output, view = "heatmap", compare, colormap = "viridis", zoom;
  int layer = 0, head = 0, gate = 0;
  int64_t step = -1, token = -1, horizon = -1;
  int width = 1600, height = 1000;
  double dpi = 150;
  bool linear = false, max = false, no_evicted = false, build_lod = false;
  std::string coloring = "all", metric = "head", series;
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
  std::string tmp = o.output + ".part";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw std::runtime_error(o.output + ": cannot open for writing");
    int64_t n = analysis::write_perfetto_json(reader, po, out);
    out.flush();
    if (!out) throw std::runtime_error(o.output + ": write failed");
    std::cout << "wrote " << o.output << " (" << n << " trace events)\n";
  }
  if (std::rename(tmp.c_str(), o.output.c_str()) != 0)
    throw std::runtime_error(o.output + ": cannot move the finished file into place");
  return kExitOk;
}

// --series: a name of the trace's /series or its index ("": the first).
int series_option(const std::string& value, const trace::TraceReader& reader) {
  if (value.empty()) return 0;
  const int64_t n = static_cast<int64_t>(reader.series().size());
  int index = reader.series_index(value);
  if (index < 0 && value.find_first_not_of("0123456789") == std::string::npos && value.size() < 9)
    index = std::stoi(value);
  if (index >= 0 && index < n) return index;
  std::string names;
  for (const trace::SeriesSpec& s : reader.series()) names += (names.empty() ? "" : ", ") + s.name;
  throw InputError(reader.path(), "--series",
                   "'" + value + "' is not a series of the trace (its series: " +
                       (names.empty() ? "none" : names) + ")");
}

int run_export(const ExportOptions& o) {
  check_output_path(o.output, "-o");
  auto reader = trace::TraceReader::open(o.trace);
  const int64_t gates = static_cast<int64_t>(reader->layout().gates.size());
  if (o.view == "gates" && o.gate >= gates)
    throw InputError(o.trace, "--gate",
                     std::to_string(o.gate) + " is outside [0, " + std::to_string(gates) +
                         ") (the trace's gates: /gates)");
  const int series = series_option(o.series, *reader);
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
  q.gate = o.gate;
  q.series = series;
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
  sub->add_option("TRACE", o->trace, "trace file")->required()->check(CLI::ExistingFile);
  sub->add_option("-o,--output", o->output, "output: .png .svg .pdf .csv (or .json for perfetto)")
      ->required();
  std::vector<std::string> views_list;
  for (const QString& n : views::figure_names()) views_list.push_back(n.toStdString());
  views_list.push_back("perfetto");
  sub->add_option("--view", o->view, "view to render")->check(CLI::IsMember(views_list));
  // Indices are checked against the trace once it is open (selection_for).
  const CLI::Range index(0, INT32_MAX);
  sub->add_option("--layer", o->layer, "layer")->check(index);
  sub->add_option("--head", o->head, "query head (its kv head follows)")->check(index);
  sub->add_option("--step", o->step, "step (default: the last)")->check(index);
  sub->add_option("--token", o->token, "selected token (history view)")->check(index);
  sub->add_option("--compare", o->compare, "second trace (compare view)")->check(CLI::ExistingFile);
  sub->add_option("--width", o->width, "width in pixels (at --dpi)")->check(CLI::Range(16, 20000));
  sub->add_option("--height", o->height, "height in pixels (at --dpi)")
      ->check(CLI::Range(16, 20000));
  sub->add_option("--dpi", o->dpi, "dots per inch: PDF/SVG page size is width/dpi inches")
      ->check(finite_range(10, 2400));
  sub->add_option("--colormap", o->colormap, "viridis, magma, cividis or grey")
      ->check(CLI::IsMember({"viridis", "magma", "cividis", "grey"}));
  sub->add_flag("--linear", o->linear, "heatmap: linear colour scale (default log)");
  sub->add_flag("--max", o->max, "heatmap: pooled max instead of mean");
  sub->add_flag("--no-evicted", o->no_evicted, "heatmap: do not mark keys no longer held");
  sub->add_option("--zoom", o->zoom, "heatmap: Q0:Q1,K0:K1 tokens; timeline: T0:T1,S0:S1");
  sub->add_option("--coloring", o->coloring, "tokens: all, layer, head or score")
      ->check(CLI::IsMember({"all", "layer", "head", "score"}));
  sub->add_option("--metric", o->metric,
                  "overview sort: head, sink-mass, local-mass, entropy, entries-held, lost-mass")
      ->check(CLI::IsMember(overview_metric_options()));
  sub->add_option("--gate", o->gate, "gates: gate index")->check(index);
  sub->add_option("--series", o->series, "cutoff: series name or index (default: the first)");
  sub->add_option("--horizon", o->horizon, "survival: horizon h for the per-head map")
      ->check(CLI::Range(1, INT32_MAX));
  sub->add_option("--layers", o->perfetto_layers, "perfetto: layers to include (default all)");
  sub->add_flag(
      "--build-lod", o->build_lod,
      "build the level-of-detail cache beside the trace when missing (else read level 0)");
  return {sub, [o] { return run_export(*o); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("export", add_export_command);

}  // namespace kvscope::cli
