// bench_gui TRACE [--frames N] [--no-window]
//
// Open-to-first-view time and per-frame paint times of the heatmap and the
// eviction timeline while zooming and panning, on a large trace. Everything
// a frame does is timed; detail reads (worker side in the GUI) are timed
// separately. Anchors measured in the same run: reading one head's whole
// level-0 pooled map (what a per-frame full scan would cost at least) and
// the one-time LOD build (a scan of all of /attention/pooled).
#include <QApplication>
#include <QElapsedTimer>
#include <QImage>
#include <QPainter>
#include <QSignalSpy>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "app/gui/main_window.h"
#include "core/analysis/attention_lod.h"
#include "views/figure_factory.h"
#include "views/heatmap_figure.h"
#include "views/overview_figure.h"
#include "views/timeline_figure.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

double ms_since(const QElapsedTimer& t) {
  return double(t.nsecsElapsed()) / 1e6;
}

struct Stats {
  double median, p95, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size())))]; };
  return {at(0.5), at(0.95), v.back()};
}

void print(const char* what, const std::vector<double>& v) {
  Stats s = stats(v);
  std::printf("| %s | %zu | %.2f | %.2f | %.2f |\n", what, v.size(), s.median, s.p95, s.max);
}

double paint_ms(const Figure& f, QImage& img) {
  QElapsedTimer t;
  t.start();
  img.fill(Qt::white);
  QPainter p(&img);
  f.paint(p, QRectF(0, 0, img.width(), img.height()));
  p.end();
  return ms_since(t);
}

// Zoom from the whole map into a 64-token window about `centre`, then pan.
std::vector<QRectF> camera_path(QRectF full, QPointF centre, int frames) {
  std::vector<QRectF> out;
  int zoom = frames / 2;
  for (int i = 0; i < zoom; ++i) {
    double f = std::pow(64.0 / full.width(), double(i) / (zoom - 1));
    double w = full.width() * f, h = full.height() * f;
    out.emplace_back(centre.x() - w / 2, centre.y() - h / 2, w, h);
  }
  for (int i = 0; i < frames - zoom; ++i) out.push_back(out.back().translated(3.0, 2.0));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_gui TRACE [--frames N] [--coarse CELLS] [--no-window]\n");
    return 2;
  }
  std::string path = argv[1];
  int frames = 200;
  bool window = true;
  double coarse = 768;  // lower it to force per-viewport detail reads (maps larger than the screen)
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--frames") && i + 1 < argc) frames = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--no-window")) window = false;
    if (!std::strcmp(argv[i], "--coarse") && i + 1 < argc) coarse = std::atof(argv[++i]);
  }
  if (!getenv("DISPLAY")) setenv("QT_QPA_PLATFORM", "offscreen", 1);
  QApplication app(argc, argv);
  const QSize frame(1200, 900);
  QImage img(frame, QImage::Format_ARGB32_Premultiplied);

  QElapsedTimer t;
  t.start();
  auto reader = trace::TraceReader::open(path);
  double open_ms = ms_since(t);
  TraceData data(*reader);
  Selection sel = selection_for(*reader, 0, 0, -1, -1);
  std::printf(
      "trace %s: %.2f GB, %lld layers x %lld heads (%lld kv), %lld tokens, %lld steps, "
      "pooled %lld x %lld blocks of %lld\n\n",
      path.c_str(), double(reader->file_bytes()) / 1e9, (long long)reader->n_layers(),
      (long long)reader->n_heads(), (long long)reader->n_kv_heads(), (long long)reader->n_tokens(),
      (long long)reader->n_steps(), (long long)reader->pooled_query_blocks(),
      (long long)reader->pooled_key_blocks(), (long long)reader->layout().pooled_block);

  std::printf("| first view (no LOD cache needed) | ms |\n|---|---|\n");
  std::printf("| open the trace (reader) | %.1f |\n", open_ms);
  t.restart();
  HeatmapOptions opts;
  auto heat = HeatmapFigure::load(data, sel, opts, QSizeF(1030, 818));
  double load_ms = ms_since(t);
  double first_paint = paint_ms(*heat, img);
  std::printf("| load heatmap figure (coarse grid, eviction state, tokens) | %.1f |\n", load_ms);
  std::printf("| paint it (1200 x 900) | %.1f |\n", first_paint);
  std::printf("| **open to first heatmap** | **%.1f** |\n", open_ms + load_ms + first_paint);

  // Anchors.
  t.restart();
  analysis::AttentionGrid whole = analysis::read_level0(
      *reader, 3, 5, 0, reader->pooled_query_blocks(), 0, reader->pooled_key_blocks());
  double anchor_head_ms = ms_since(t);
  std::string cache = analysis::AttentionLod::default_cache_path(path);
  t.restart();
  std::shared_ptr<analysis::AttentionLod> lod = analysis::AttentionLod::open(*reader, cache);
  bool built = false;
  if (!lod) {
    lod = analysis::AttentionLod::build(*reader, cache);
    built = true;
  }
  double lod_ms = ms_since(t);
  data.set_lod(lod);
  std::printf("\n| anchor | ms |\n|---|---|\n");
  std::printf("| read one head's whole level-0 map (%lld x %lld cells, max+mean) | %.1f |\n",
              (long long)whole.rows(), (long long)whole.cols(), anchor_head_ms);
  std::printf("| LOD cache %s (%d levels) | %.1f |\n",
              built ? "build (scan of all pooled data, once per trace)" : "open (already built)",
              lod->n_levels(), lod_ms);

  t.restart();
  auto overview = OverviewFigure::load(data, sel, OverviewMetric::Entropy);
  double overview_ms = ms_since(t);
  double overview_paint = paint_ms(*overview, img);
  std::printf("| overview: %lld thumbnails from the cache, load | %.1f |\n",
              (long long)(reader->n_layers() * reader->n_heads()), overview_ms);
  std::printf("| overview paint | %.1f |\n", overview_paint);

  // Heatmap zoom and pan: frame = paint; detail reads timed separately.
  opts.coarse_cells = coarse;
  heat = HeatmapFigure::load(data, sel, opts, QSizeF(1030, 818));
  QSizeF px = HeatmapFigure::plot_rect(QRectF(0, 0, frame.width(), frame.height())).size();
  std::vector<double> heat_frames, detail_reads;
  for (const QRectF& v : camera_path(heat->extent(), heat->extent().center() * 0.7, frames)) {
    heat->set_viewport(v);
    if (heat->wants_detail(px)) {
      t.restart();
      // As the GUI's worker does: read and colour off the frame.
      analysis::AttentionGrid g =
          HeatmapFigure::load_detail(data, 0, 0, heat->viewport(), px, heat->block);
      QImage coloured = HeatmapFigure::colorize_grid(g, heat->options(), heat->scale());
      heat->set_detail(std::move(g), std::move(coloured));
      detail_reads.push_back(ms_since(t));
    }
    heat_frames.push_back(paint_ms(*heat, img));
  }
  // The timeline: per frame the lifetimes are folded to pixels.
  t.restart();
  auto timeline = TimelineFigure::load(data, sel, TimelineMode::Head);
  double timeline_load = ms_since(t);
  std::vector<double> timeline_frames;
  QRectF te = timeline->extent();
  for (int i = 0; i < frames; ++i) {
    double f = std::pow(0.02, double(i % (frames / 2)) / (frames / 2 - 1));
    double w = te.width() * std::max(f, 8.0 / te.width()), h = te.height() * f;
    timeline->set_viewport(
        QRectF(te.width() * 0.6 - w / 2 + i, te.height() * 0.5 - h / 2 + 4 * i, w, h));
    timeline_frames.push_back(paint_ms(*timeline, img));
  }
  t.restart();
  auto layers = TimelineFigure::load(data, sel, TimelineMode::Layers);
  double layers_load = ms_since(t);
  std::vector<double> layers_frames;
  for (int i = 0; i < frames; ++i) {
    double f = std::pow(0.01, double(i % (frames / 2)) / (frames / 2 - 1));
    double w = layers->extent().width() * std::max(f, 112.0 / layers->extent().width());
    layers->set_viewport(
        QRectF(layers->extent().width() * 0.5 - w / 2 + i, 0, w, layers->extent().height()));
    layers_frames.push_back(paint_ms(*layers, img));
  }
  std::printf("| timeline (one head) load | %.1f |\n", timeline_load);
  std::printf("| heads-holding (all %lld heads) load | %.1f |\n",
              (long long)(reader->n_layers() * reader->n_kv_heads()), layers_load);

  std::printf(
      "\n| frames (1200 x 900) | n | median ms | p95 ms | max ms |\n|---|---|---|---|---|\n");
  std::printf("| heatmap zoom + pan, paint (coarse grid %.0f cells) | %zu | %.2f | %.2f | %.2f |\n",
              coarse, heat_frames.size(), stats(heat_frames).median, stats(heat_frames).p95,
              stats(heat_frames).max);
  if (!detail_reads.empty())
    print("heatmap detail read + colour (worker, not per frame)", detail_reads);
  print("eviction timeline zoom + pan (fold + paint)", timeline_frames);
  print("heads-holding zoom + pan (fold + paint)", layers_frames);

  if (window) {
    // The real main window: open to the first painted heatmap.
    gui::MainWindow w;
    w.show();
    QSignalSpy shown(&w, &gui::MainWindow::firstViewShown);
    w.open_trace(QString::fromStdString(path));
    shown.wait(60000);
    std::printf("\nmain window (%s): open to first painted heatmap %.1f ms\n",
                qPrintable(QGuiApplication::platformName()), w.first_view_ms());
  }
  return 0;
}
