// Figures and widgets rendered offscreen and checked at known pixels.
#include <QImage>
#include <QPainter>
#include <QRegularExpression>
#include <QSignalSpy>
#include <catch2/catch.hpp>

#include <set>

#include "core/analysis/lifetimes.h"
#include "core/analysis/trace_diff.h"
#include "core/analysis/why.h"
#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/budget_figure.h"
#include "views/compare_figure.h"
#include "views/cutoff_view.h"
#include "views/figure_factory.h"
#include "views/gates_figure.h"
#include "views/heatmap_view.h"
#include "views/layer_marks.h"
#include "views/layout_check.h"
#include "views/needle_figure.h"
#include "views/overview_figure.h"
#include "views/overview_view.h"
#include "views/task_marks.h"
#include "views/timeline_figure.h"
#include "views/timeline_view.h"
#include "views/tokens_figure.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

QImage render(const Figure& f, int w = 1000, int h = 800) {
  QImage img(w, h, QImage::Format_ARGB32);
  img.fill(Qt::white);
  QPainter p(&img);
  f.paint(p, QRectF(0, 0, w, h));
  return img;
}

bool near(QRgb a, QColor b, int tol = 3) {
  return std::abs(qRed(a) - b.red()) <= tol && std::abs(qGreen(a) - b.green()) <= tol &&
         std::abs(qBlue(a) - b.blue()) <= tol;
}

std::string rgb(QRgb c) {
  return std::to_string(qRed(c)) + "," + std::to_string(qGreen(c)) + "," + std::to_string(qBlue(c));
}

struct Loaded {
  std::unique_ptr<trace::TraceReader> reader;
  std::unique_ptr<TraceData> data;
  Selection sel;
};

Loaded load(const trace::SyntheticSpec& spec, int layer, int head, int64_t step) {
  Loaded l;
  l.reader = trace::TraceReader::open(test::write_trace(spec));
  l.data = std::make_unique<TraceData>(*l.reader);
  l.sel = selection_for(*l.reader, layer, head, step, -1);
  return l;
}

}  // namespace

TEST_CASE(
    "heatmap pixels: attention cells in the colour scale, nothing above the diagonal, evicted keys "
    "marked") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::lod_spec();
  Loaded l = load(spec, 0, 1, 10);
  HeatmapOptions o;
  auto f = HeatmapFigure::load(*l.data, l.sel, o, QSizeF(900, 700));
  REQUIRE(f->available);
  REQUIRE(f->extent() == QRectF(0, 0, 256, 256));
  QImage img = render(*f);
  QRectF plot = f->zoomed_plot_rect(QRectF(0, 0, 1000, 800));
  auto px = [&](double key, double query) {
    return QPoint(int(plot.left() + key / 256.0 * plot.width()),
                  int(plot.top() + query / 256.0 * plot.height()));
  };
  // A sink key (held by every head) for query 102: exactly the scale's colour.
  float v = f->value_at(2, 102);
  REQUIRE(v > 0.f);
  QRgb sink = img.pixel(px(2, 102));
  INFO("sink pixel " << rgb(sink));
  CHECK(near(sink, QColor(f->scale().color(v)), 1));
  // Above the causal diagonal there is no attention: the background shows.
  CHECK(near(img.pixel(px(200, 20)), QColor(248, 248, 248), 1));
  // Key 60 is no longer held by kv head 0 at step 10: its column is veiled
  // and the strip above the plot is dark grey (the key's "not held" colour,
  // not the needle's vermillion); the sink's strip is white.
  int64_t evict = trace::synthetic_evict_step(spec, 0, 0, 60);
  REQUIRE(evict >= 0);
  REQUIRE(evict <= 10);
  QRgb strip_evicted = img.pixel(px(60, 0).x(), int(plot.top()) - 3);
  QRgb strip_held = img.pixel(px(2, 0).x(), int(plot.top()) - 3);
  INFO("strip " << rgb(strip_evicted));
  CHECK(qRed(strip_evicted) < 120);
  CHECK(qRed(strip_evicted) == qGreen(strip_evicted));
  CHECK(qGreen(strip_evicted) == qBlue(strip_evicted));
  CHECK(near(strip_held, Qt::white, 0));
  QRgb veiled = img.pixel(px(62, 200));
  float under = f->value_at(62, 200);
  CHECK_FALSE(near(veiled, QColor(f->scale().color(under)), 3));  // dimmed, not the raw colour
}

TEST_CASE("heatmap zoomed in reads a finer level for the viewport only and shows token text") {
  test::qt_app(true);
  Loaded l = load(test::lod_spec(), 1, 2, 20);
  HeatmapOptions o;
  o.coarse_cells = 16;  // the whole 64 x 64 map as a 16 x 16 coarse grid (level 2)
  auto f = HeatmapFigure::load(*l.data, l.sel, o, QSizeF(60, 60));
  f->set_viewport(QRectF(100, 120, 16, 16));
  QSizeF px(800, 700);
  REQUIRE(f->wants_detail(px));
  analysis::AttentionGrid g =
      HeatmapFigure::load_detail(*l.data, 1, 2, f->viewport(), px, f->block);
  CHECK(g.level == 0);
  CHECK(g.rows() <= 5);  // 16 tokens = 4 blocks (+1 for alignment), not the whole map
  CHECK(g.cols() <= 5);
  f->set_detail(g);
  CHECK_FALSE(f->wants_detail(px));
  QImage img = render(*f);
  // 16 tokens over ~830 px: token labels replace the numeric ticks.
  QRectF plot = f->zoomed_plot_rect(QRectF(0, 0, 1000, 800));
  int dark = 0;
  for (int x = int(plot.left()); x < int(plot.right()); ++x)
    for (int y = int(plot.bottom()) + 6; y < int(plot.bottom()) + 40; ++y)
      dark += qGray(img.pixel(x, y)) < 100;
  CHECK(dark > 200);
}

TEST_CASE("dense heads show token-resolution attention: cells equal the dense rows") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();  // dense heads (0, 0) and (3, 7)
  Loaded l = load(spec, 3, 7, 20);
  auto f = HeatmapFigure::load(*l.data, l.sel, HeatmapOptions{}, QSizeF(900, 700));
  REQUIRE(f->dense_index == 1);
  CHECK(f->block == 1);
  std::vector<float> rows = l.reader->dense_rows(1, 50, 51);
  for (int64_t k = 0; k <= 50; ++k) REQUIRE(f->value_at(double(k) + 0.5, 50.5) == rows[size_t(k)]);
  // Zoomed into 12 tokens: one cell per token, token text on both axes.
  f->set_viewport(QRectF(40, 44, 12, 12));
  QSizeF px(830, 718);
  if (f->wants_detail(px))
    f->set_detail(
        HeatmapFigure::load_detail(*l.data, 3, 7, f->viewport(), px, f->block, f->dense_index));
  CHECK(f->value_at(45.5, 50.5) == rows[45]);
  HeatmapOptions pooled;
  pooled.prefer_dense = false;
  CHECK(HeatmapFigure::load(*l.data, l.sel, pooled, QSizeF(900, 700))->dense_index == -1);
}

TEST_CASE("timeline pixels: held in tier colour until the eviction step, then evicted") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  Loaded l = load(spec, 0, 4, 20);  // query head 4 -> kv head 2
  REQUIRE(l.sel.kv_head() == 2);
  auto f = TimelineFigure::load(*l.data, l.sel, TimelineMode::Head);
  QImage img = render(*f);
  QRectF plot = f->plot_rect(QRectF(0, 0, 1000, 800));
  QRectF v = f->viewport();
  auto px = [&](double step, double token) {
    return QPoint(int(plot.left() + (step - v.left()) / v.width() * plot.width()),
                  int(plot.top() + (token - v.top()) / v.height() * plot.height()));
  };
  analysis::TimelineClasses cls{1};
  CHECK(near(img.pixel(px(7.5, 30.5)), timeline_class_color(cls, cls.evicted())));
  CHECK(near(img.pixel(px(5.5, 30.5)), timeline_class_color(cls, 0)));
  CHECK(f->cell_color(7, 30) == timeline_class_color(cls, cls.evicted()));
  CHECK(f->cell_color(6, 30) == timeline_class_color(cls, 0));
  // A sink is never evicted.
  CHECK(near(img.pixel(px(30.5, 1.5)), timeline_class_color(cls, 0)));
}

TEST_CASE("layers mode counts the heads of each layer holding each token") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  Loaded l = load(spec, 0, 0, 12);
  auto f = TimelineFigure::load(*l.data, l.sel, TimelineMode::Layers);
  for (int layer = 0; layer < spec.layers; ++layer)
    for (int64_t t = 0; t < f->n_tokens; ++t) {
      int n = 0;
      for (int k = 0; k < spec.kv_heads; ++k)
        n += analysis::held_at(trace::synthetic_admit_step(spec, t),
                               trace::synthetic_evict_step(spec, layer, k, t), 12);
      REQUIRE(f->counts[size_t(layer * f->n_tokens + t)] == n);
    }
}

TEST_CASE("budget grid cells are coloured by entries held at the step") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  Loaded l = load(spec, 1, 2, 15);
  auto f = BudgetFigure::load(*l.data, l.sel);
  QRectF area(0, 0, 1200, 700);
  QImage img = render(*f, 1200, 700);
  int64_t hi = 0;
  for (int a = 0; a < spec.layers; ++a)
    for (int k = 0; k < spec.kv_heads; ++k) hi = std::max(hi, f->head_total(a, k));
  ColorScale cs;
  cs.lo = 0;
  cs.hi = float(hi);
  // Sinks + window + the head's extra window: entries after step 15.
  int64_t expect = spec.sinks + trace::synthetic_window(spec, 3, 1);
  CHECK(f->head_total(3, 1) == expect);
  QPointF c = f->grid_cell(area, 3, 1).center();
  CHECK(near(img.pixel(c.toPoint()), QColor(cs.color(float(expect))), 1));
}

TEST_CASE("tokens: hit testing, per-head values and the history of one token") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  Loaded l = load(spec, 0, 4, 9);
  auto f = TokensFigure::load(*l.data, l.sel, TokenColoring::Layer);
  QRectF area(0, 0, 900, 600);
  QImage img = render(*f, 900, 600);
  f->content_height(area.width());
  // Find token 30's box by scanning: token_at must round-trip.
  bool found = false;
  for (int y = 40; y < 600 && !found; y += 4)
    for (int x = 0; x < 900 && !found; x += 3)
      if (f->token_at(area, QPointF(x, y)) == 30) found = true;
  CHECK(found);
  int n = 0;
  for (int k = 0; k < spec.kv_heads; ++k)
    n += analysis::held_at(trace::synthetic_admit_step(spec, 30),
                           trace::synthetic_evict_step(spec, 0, k, 30), 9);
  CHECK(f->value(30) == Approx(double(n) / spec.kv_heads));
  CHECK(f->tooltip(30).contains("layer  0"));
  Selection sel = l.sel;
  sel.tokens = {30};
  auto h = TokenHistoryFigure::load(*l.data, sel);
  REQUIRE(h->admit.size() == size_t(spec.layers * spec.kv_heads));
  CHECK(h->evict[size_t(0 * spec.kv_heads + 2)] == 7);  // token 30 leaves (0, 2) at step 7
  CHECK(h->samples.size() == 1);                        // one forecast sample at its admission
  // A long series name beside a short strip (a dock's size) is elided along
  // it and named whole under it, never run up into the rows' axis title.
  h->sample_gate = "tova_last_query_attention";
  const LayoutReport report = check_layout(*h, {330, 380, 96});
  std::string problems;
  for (const QString& problem : report.problems) problems += problem.toStdString() + "\n";
  INFO(problems);
  CHECK(report.ok());
}

TEST_CASE("gates: histogram covers every scored token, threshold from the trace") {
  test::qt_app(true);
  Loaded l = load(test::small_spec(), 2, 3, 10);
  auto f = GatesFigure::load(*l.data, l.sel, 0);
  CHECK(f->gate_name == "synthetic_gate");
  CHECK(f->threshold == Approx(0.5));
  int64_t total = 0;
  for (int64_t c : f->histogram) total += c;
  CHECK(total == int64_t(f->values.size()));
  CHECK(f->values[5] == Approx(trace::synthetic_gate(test::small_spec(), 2, 1, 5)));
}

namespace {

// Finite range and runs (maximal stretches of finite values) of a series.
struct SeriesTruth {
  float lo = INFINITY, hi = -INFINITY;
  int runs = 0;
};

SeriesTruth series_truth(const trace::SyntheticSpec& spec, int64_t steps, int layer, int kv) {
  SeriesTruth t;
  bool in_run = false;
  for (int64_t s = 0; s < steps; ++s) {
    float v = trace::synthetic_series(spec, s, layer, kv);
    if (std::isfinite(v)) t.lo = std::min(t.lo, v), t.hi = std::max(t.hi, v);
    t.runs += std::isfinite(v) && !in_run;
    in_run = std::isfinite(v);
  }
  return t;
}

// Data range [lo, hi] of the y pixels of some polylines.
std::pair<double, double> y_extent(const std::vector<QPolygonF>& line, const plot::Map& my) {
  double lo = INFINITY, hi = -INFINITY;
  for (const QPolygonF& run : line)
    for (const QPointF& p : run)
      lo = std::min(lo, my.inverse(p.y())), hi = std::max(hi, my.inverse(p.y()));
  return {lo, hi};
}

}  // namespace

TEST_CASE("cutoff: the series as a line, every scored decision of the head as a point") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  spec.tiers = 2;                   // demote out of the window, evict later: two decision kinds
  Loaded l = load(spec, 1, 2, 10);  // kv head 1
  auto f = CutoffFigure::load(*l.data, l.sel, 0);
  REQUIRE(f->series_name == "cutoff");
  REQUIRE(f->kv_head == 1);
  // The decisions are the head's events with a finite score, read back plainly.
  int64_t finite = 0;
  for (const trace::Event& e : l.reader->events(0, l.reader->n_events()))
    finite += e.layer == 1 && e.kv_head == 1 && std::isfinite(e.score);
  CHECK(int64_t(f->decisions.size()) == finite);
  // The evictions are the synthetic policy's, under their reason and kind.
  int64_t evicted = 0;
  for (int64_t t = 0; t < l.reader->n_tokens(); ++t)
    evicted += trace::synthetic_evict_step(spec, 1, 1, t) >= 0;
  auto evict = std::find_if(f->classes.begin(), f->classes.end(),
                            [](const auto& c) { return c.kind == trace::EventKind::Evict; });
  REQUIRE(evict != f->classes.end());
  CHECK(evict->label == "outside window (evict)");
  CHECK(evict->removes);
  CHECK(evict->count == evicted);
  // The series per step, NaN holes included; its finite range.
  REQUIRE(int64_t(f->values.size()) == l.reader->n_steps());
  for (int64_t s = 0; s < l.reader->n_steps(); ++s) {
    float v = trace::synthetic_series(spec, s, 1, 1);
    INFO("step " << s);
    CHECK((std::isnan(v) ? std::isnan(f->values[size_t(s)]) : f->values[size_t(s)] == v));
  }
  SeriesTruth truth = series_truth(spec, l.reader->n_steps(), 1, 1);
  CHECK(f->value_min == truth.lo);
  CHECK(f->value_max == truth.hi);

  // Drawn with a pixel per step or more: one marker per decision, the line
  // broken at every hole and spanning the series' finite range.
  QRectF plot = f->layout(QRectF(0, 0, 1000, 700)).plot;
  CutoffFigure::Marks m = f->marks(plot, int(plot.width()));
  size_t markers = 0;
  for (size_t k = 0; k < m.points.size(); ++k) markers += m.points[k].size() + m.bins[k].size();
  CHECK(int64_t(markers) == finite);
  CHECK(int(m.line.size()) == truth.runs);
  auto [lo, hi] = y_extent(m.line, f->y_map(plot));
  CHECK(lo == Approx(truth.lo).margin(1e-5));
  CHECK(hi == Approx(truth.hi).margin(1e-5));
  // A click on a drawn decision finds it.
  const CutoffFigure::Decision& d = f->decisions[f->decisions.size() / 2];
  QPointF at(f->x_map(plot)(d.step), f->y_map(plot)(d.score));
  int64_t hit = f->decision_at(QRectF(0, 0, 1000, 700), at + QPointF(2, 1));
  REQUIRE(hit >= 0);
  CHECK(f->decisions[size_t(hit)].step == d.step);
  CHECK(f->decisions[size_t(hit)].score == d.score);

  // Fewer pixel columns than steps and decisions: a min-max per column, so
  // the drawing is bounded by the pixels and still reaches both extremes.
  const int cols = 6;
  CutoffFigure::Marks folded = f->marks(plot, cols);
  size_t vertices = 0;
  for (const QPolygonF& run : folded.line) vertices += size_t(run.size());
  CHECK(vertices <= 2 * cols);
  for (size_t k = 0; k < f->classes.size(); ++k) {
    INFO("class " << f->classes[k].label.toStdString());
    bool fold = f->classes[k].count > cols;  // the 4 sinks stay points
    CHECK(folded.bins[k].size() <= size_t(cols));
    CHECK(folded.bins[k].empty() != fold);
    CHECK(int64_t(folded.points[k].size()) == (fold ? 0 : f->classes[k].count));
  }
  auto [flo, fhi] = y_extent(folded.line, f->y_map(plot));
  CHECK(flo == Approx(truth.lo).margin(1e-5));
  CHECK(fhi == Approx(truth.hi).margin(1e-5));
}

TEST_CASE("cutoff view follows the head, and a new step only moves its line") {
  test::qt_app(true);
  std::string path = test::write_trace(test::small_spec());
  CurrentState state;
  TraceService service;
  CutoffView view(&state, &service);
  view.resize(700, 450);
  QSignalSpy loaded(&view, &FigureWidget::figureLoaded);
  auto r = trace::TraceReader::open(path);
  state.set_trace(path, r->n_layers(), r->n_heads(), r->n_kv_heads(), r->n_steps(), r->n_tokens());
  REQUIRE(loaded.wait(20000));
  REQUIRE(view.cutoff());
  CHECK(view.cutoff()->series_names == QStringList{"cutoff"});
  auto* before = view.cutoff();
  state.set_step(5);
  QCoreApplication::processEvents();
  CHECK(view.cutoff() == before);
  CHECK(view.cutoff()->step == 5);
  // A step set while a figure loads is the step the arriving figure shows.
  state.set_head(2, 6);  // kv head 3
  state.set_step(9);
  REQUIRE(loaded.wait(20000));
  CHECK(view.cutoff()->layer == 2);
  CHECK(view.cutoff()->kv_head == 3);
  CHECK(view.cutoff()->step == 9);
  // A click on a decision selects its token and step for every view.
  const CutoffFigure::Decision d = view.cutoff()->decisions.back();
  QRectF plot = view.cutoff()->layout(QRectF(view.rect())).plot;
  view.click_at(QPointF(view.cutoff()->x_map(plot)(d.step), view.cutoff()->y_map(plot)(d.score)));
  CHECK(state.selection().step == d.step);
  CHECK(state.selection().token() == d.token);
}

TEST_CASE("overview sorts heads by a metric from the LOD cache and maps clicks to heads") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::lod_spec();
  Loaded l = load(spec, 0, 0, 5);
  std::string cache = analysis::AttentionLod::default_cache_path(l.reader->path());
  l.data->set_lod(analysis::AttentionLod::build(*l.reader, cache));
  auto f = OverviewFigure::load(*l.data, l.sel, OverviewMetric::SinkMass);
  REQUIRE(f->thumbnails);
  auto lod = l.data->lod();
  for (int layer = 0; layer < spec.layers; ++layer)
    for (int c = 1; c < spec.heads; ++c)
      CHECK(lod->metric(layer, f->order[size_t(layer)][size_t(c - 1)],
                        analysis::HeadMetric::SinkMass) >=
            lod->metric(layer, f->order[size_t(layer)][size_t(c)], analysis::HeadMetric::SinkMass));
  QRectF area(0, 0, 800, 500);
  QRectF plot = area.adjusted(56, 36, -8, -30);
  QPointF cell_centre(plot.left() + (2.5 / spec.heads) * plot.width(),
                      plot.top() + 1.5 / spec.layers * plot.height());
  auto [layer, head] = f->head_at(area, cell_centre);
  CHECK(layer == 1);
  CHECK(head == f->order[1][2]);
}

TEST_CASE("overview and head budgets mark the sliding-window layers", "[views][layers]") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::lod_spec();  // 2 layers x 4 heads
  spec.layer_windows = {6, 0};
  Loaded l = load(spec, 0, 0, 5);
  CHECK(window_layers_caption(spec.layer_windows) == "blue bar: window 6 on 1/2 layers");
  CHECK(window_layers_caption({0, 0}).isEmpty());
  const QRectF area(0, 0, 800, 500);
  auto sky_at = [](const QImage& img, double x, double y) {
    return img.pixelColor(int(x), int(y)) == palette::kSky;
  };
  auto render = [&](const Figure& f) {
    QImage img(800, 500, QImage::Format_ARGB32);
    img.fill(Qt::white);
    QPainter p(&img);
    f.paint(p, area);
    return img;
  };
  auto overview = OverviewFigure::load(*l.data, l.sel, OverviewMetric::Head);
  REQUIRE(overview->windows == spec.layer_windows);
  const QImage o = render(*overview);
  const QRectF g = overview->grid(area);
  const double row = g.height() / 2;
  CHECK(sky_at(o, g.right() + 3, g.top() + row / 2));          // layer 0: windowed
  CHECK_FALSE(sky_at(o, g.right() + 3, g.top() + 1.5 * row));  // layer 1: global
  auto budget = BudgetFigure::load(*l.data, l.sel);
  const QImage b = render(*budget);
  const QRectF c0 = budget->grid_cell(area, 0, int(spec.kv_heads) - 1);
  const QRectF c1 = budget->grid_cell(area, 1, int(spec.kv_heads) - 1);
  CHECK(sky_at(b, c0.right() + 3, c0.center().y()));
  CHECK_FALSE(sky_at(b, c1.right() + 3, c1.center().y()));
  // Without window layers neither view draws a bar.
  spec.layer_windows.clear();
  auto reader = trace::TraceReader::open(test::write_trace(spec, "global.h5"));
  TraceData data(*reader);
  auto global =
      OverviewFigure::load(data, selection_for(*reader, 0, 0, 5, -1), OverviewMetric::Head);
  const QImage og = render(*global);
  const QRectF gg = global->grid(area);
  CHECK_FALSE(sky_at(og, gg.right() + 3, gg.top() + gg.height() / 4));
}

TEST_CASE(
    "widgets follow the state offscreen: heatmap loads, zooms and asks the worker for detail") {
  test::qt_app(true);
  std::string path = test::write_trace(test::lod_spec());
  CurrentState state;
  TraceService service;
  HeatmapView heat(&state, &service);
  OverviewView overview(&state, &service);
  heat.setMinimumSize(0, 0);
  heat.resize(180, 130);  // small: the coarse grid is all the first view needs
  HeatmapOptions coarse;
  coarse.coarse_cells = 16;  // so that zooming in needs finer levels from the worker
  heat.set_options(coarse);
  overview.resize(400, 300);
  QSignalSpy heat_loaded(&heat, &FigureWidget::figureLoaded);
  QSignalSpy overview_loaded(&overview, &FigureWidget::figureLoaded);
  auto r = trace::TraceReader::open(path);
  state.set_trace(path, r->n_layers(), r->n_heads(), r->n_kv_heads(), r->n_steps(), r->n_tokens());
  REQUIRE(heat_loaded.wait(20000));
  if (overview_loaded.isEmpty()) REQUIRE(overview_loaded.wait(20000));
  REQUIRE(heat.heatmap());
  CHECK(heat.heatmap()->layer == 0);
  // A click in the overview changes the head for everyone else; the overview
  // itself only moves its highlight (it made the change).
  auto* before = overview.figure().get();
  overview.click_at(QPointF(56 + (3.5 / 4) * (400 - 64), 36 + 1.5 / 2 * (300 - 66)));
  CHECK(state.selection().layer == 1);
  REQUIRE(heat_loaded.wait(20000));
  CHECK(heat.heatmap()->layer == 1);
  CHECK(heat.heatmap()->head == state.selection().head);
  CHECK(overview.figure().get() == before);
  // Another step: the grids are kept, the eviction state is that of the new step.
  trace::SyntheticSpec spec = test::lod_spec();
  state.set_step(6);
  REQUIRE(heat_loaded.wait(20000));
  HeatmapFigure* at6 = heat.heatmap();
  REQUIRE(at6->step == 6);
  int kv = state.selection().kv_head();
  for (int64_t t = 0; t < at6->n_tokens; ++t)
    REQUIRE(bool(at6->key_held[size_t(t)]) ==
            analysis::held_at(trace::synthetic_admit_step(spec, t),
                              trace::synthetic_evict_step(spec, 1, kv, t), 6));
  // Zoom far in: the figure's viewport shrinks and a detail request goes out.
  QImage first = heat.grab().toImage();
  CHECK(heat.detail_requests() == 0);
  for (int i = 0; i < 12; ++i) heat.zoom_at(QPointF(75, 60), 0.7);
  CHECK(heat.heatmap()->viewport().width() < 20);
  INFO("viewport " << heat.heatmap()->viewport().width() << " plot "
                   << HeatmapFigure::plot_rect(QRectF(heat.rect())).width() << " wants "
                   << heat.heatmap()->wants_detail(QSizeF(30, 78)) << " opts "
                   << heat.heatmap()->options().coarse_cells);
  CHECK(heat.detail_requests() > 0);
  service.wait_idle();
  QCoreApplication::processEvents();
  CHECK_FALSE(
      heat.heatmap()->wants_detail(QSizeF(HeatmapFigure::plot_rect(QRectF(heat.rect())).size())));
  QImage zoomed = heat.grab().toImage();
  CHECK(zoomed != first);
}

TEST_CASE("gate scores spanning decades get a log axis, a narrow range stays linear") {
  GatesFigure wgkv;
  wgkv.values = {0.0005f, 0.001f, 0.002f, NAN, 0.9f};  // WG-KV-like: most near 1e-3
  wgkv.threshold = 0.1;
  wgkv.fit_axis();
  CHECK(wgkv.log_scale);
  CHECK(wgkv.lo == Approx(-4));  // whole decades around 5e-4 .. 0.9
  CHECK(wgkv.hi == Approx(0));
  // The three small scores no longer share one bin at the bottom of the axis.
  int used = 0;
  for (int64_t n : wgkv.histogram) used += n > 0;
  CHECK(used == 4);
  GatesFigure linear;
  linear.values = {0.2f, 0.5f, 0.8f};
  linear.fit_axis();
  CHECK_FALSE(linear.log_scale);
  CHECK(linear.lo == Approx(0.2));
  GatesFigure signed_scores;
  signed_scores.values = {-3.f, 0.001f, 5.f};  // not all positive: linear
  signed_scores.fit_axis();
  CHECK_FALSE(signed_scores.log_scale);
}

TEST_CASE("compare follows the needle (or the selection) over the steps: held by one, attention") {
  test::qt_app(true);
  trace::SyntheticSpec sa = test::with_needle(test::small_spec(), 20, 6, 4), sb = sa;
  sb.window = 8;
  Loaded a = load(sa, 1, 2, 20), b = load(sb, 1, 2, 20);
  auto f = CompareFigure::load(*a.data, *b.data, a.sel);
  // No selection: the needle, tokens 20..25.
  CHECK(f->span_name == "needle");
  CHECK(f->span == std::vector<int64_t>{20, 21, 22, 23, 24, 25});
  REQUIRE(f->span_diff.steps == a.reader->n_steps());
  std::vector<int64_t> step_b(size_t(f->span_diff.steps));
  for (int64_t s = 0; s < f->span_diff.steps; ++s)
    step_b[size_t(s)] =
        analysis::aligned_step(b.data->basics().fed_step, a.data->basics().steps, s);
  const analysis::SpanDiff d =
      analysis::diff_span(a.data->all_lifetimes(), b.data->all_lifetimes(), f->span, step_b);
  CHECK(f->span_diff.only_a == d.only_a);
  CHECK(f->span_diff.only_b == d.only_b);
  float most = 0;
  for (float x : d.only_a) most = std::max(most, x);
  CHECK(most > 0);  // A's longer window keeps the needle after B has let it go
  // Attention on the needle from the first decode step, none before.
  REQUIRE(f->answer_step > 0);
  CHECK(std::isnan(f->span_mass_a[size_t(f->answer_step - 1)]));
  const std::vector<int32_t> needle(f->span.begin(), f->span.end());
  for (int64_t s = f->answer_step; s < a.reader->n_steps(); ++s) {
    CHECK(f->span_mass_a[size_t(s)] == analysis::received_mass_on(*a.reader, needle, s));
    CHECK(f->span_mass_b[size_t(s)] ==
          analysis::received_mass_on(*b.reader, needle, step_b[size_t(s)]));
  }
  // Selected tokens take the needle's place; the CSV holds the span's table.
  a.sel.tokens = {40, 41};
  auto g = CompareFigure::load(*a.data, *b.data, a.sel);
  CHECK(g->span_name == "selection");
  CHECK(g->span == std::vector<int64_t>{40, 41});
  QString csv;
  QTextStream out(&csv);
  g->write_csv(out);
  out.flush();
  CHECK(csv.contains("# selection: 2 tokens from token 40"));
  CHECK(csv.count('\n') > 3 + int(a.reader->n_steps() * sa.layers * sa.kv_heads));
  // Drawn: the span's row has A-only blue somewhere at 1600 x 1000.
  const QImage img = render(*f, 1600, 1000);
  int blue = 0;
  for (int y = 0; y < img.height(); y += 3)
    for (int x = 0; x < img.width(); x += 3) blue += near(img.pixel(x, y), palette::kBlue, 40);
  CHECK(blue > 20);
}

TEST_CASE("needle view: share held per head, loss steps and attention on the needle") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::with_needle(test::small_spec(), 20, 6, 4);
  Loaded l = load(spec, 0, 0, 30);
  auto f = NeedleFigure::load(*l.data, nullptr, l.sel);
  REQUIRE(f->needle == std::vector<int64_t>{20, 21, 22, 23, 24, 25});
  for (int layer = 0; layer < spec.layers; ++layer)
    for (int k = 0; k < spec.kv_heads; ++k)
      for (int64_t s : {int64_t(5), int64_t(30), int64_t(60)}) {
        int held = 0;
        for (int64_t t : f->needle)
          held += analysis::held_at(trace::synthetic_admit_step(spec, t),
                                    trace::synthetic_evict_step(spec, layer, k, t), s);
        REQUIRE(f->held_share(layer, k, s) == Approx(held / 6.0));
      }
  REQUIRE(f->answer_step > 0);
  const std::vector<int32_t> needle(f->needle.begin(), f->needle.end());
  for (int64_t s = f->answer_step; s < l.reader->n_steps(); ++s)
    CHECK(f->mass[size_t(s)] == analysis::received_mass_on(*l.reader, needle, s));
}

TEST_CASE("timeline tooltip: the cell's token, step and state in words, in both modes") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  Loaded l = load(spec, 1, 2, 20);
  auto f = TimelineFigure::load(*l.data, l.sel, TimelineMode::Head);
  const int layer = 1, kv_head = l.sel.kv_head();
  int checked = 0;
  for (int64_t t : {int64_t(0), int64_t(10), int64_t(30), int64_t(60)})
    for (int64_t s : {int64_t(0), int64_t(5), int64_t(20), int64_t(30)}) {
      const int32_t admit = trace::synthetic_admit_step(spec, t);
      const int32_t evict = trace::synthetic_evict_step(spec, layer, kv_head, t);
      const QString d = f->describe(double(s) + 0.5, double(t) + 0.5);
      INFO(d.toStdString());
      CHECK(d.startsWith(QString("token %1 ").arg(t)));
      CHECK(d.contains(QString("step %1: ").arg(s)));
      const char* state = analysis::held_at(admit, evict, s) ? ": held"
                          : f->head->fed_step[size_t(t)] > s ? ": not fed yet"
                          : admit < 0                        ? ": never admitted"
                                                             : ": evicted";
      CHECK(d.contains(state));
      CHECK(d.contains(evict < 0 ? QString("evicted never")
                                 : QString("evicted at step %1").arg(evict)));
      ++checked;
    }
  CHECK(checked == 16);
  CHECK(f->describe(-1, 3).isEmpty());
  CHECK(f->describe(3, double(f->n_tokens) + 2).isEmpty());
  auto g = TimelineFigure::load(*l.data, l.sel, TimelineMode::Layers);
  const QString d = g->describe(10.5, 2.5);
  INFO(d.toStdString());
  CHECK(d.contains(QString("layer 2: %1 of %2 kv heads hold it at step 20")
                       .arg(g->counts[size_t(2 * g->n_tokens + 10)])
                       .arg(spec.kv_heads)));
}

TEST_CASE("overview: heads appear as the LOD build finishes them, before the cache is done") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::lod_spec();  // 2 layers x 4 heads
  Loaded l = load(spec, 0, 0, 10);
  // No cache yet: no thumbnails, a note.
  auto none = OverviewFigure::load(*l.data, l.sel, OverviewMetric::SinkMass);
  CHECK_FALSE(none->thumbnails);
  // Three heads built: their thumbnails and metrics, the rest blank.
  auto partial = std::make_shared<PartialLod>(spec.layers, spec.heads);
  const analysis::AttentionGrid g = analysis::downsample(
      analysis::downsample(analysis::read_level0(*l.reader, 0, 0, 0, 64, 0, 64)));
  partial->add(0, 1, g, {0.9f, 0.1f, 0.5f});
  partial->add(1, 2, g, {0.2f, 0.3f, 0.4f});
  partial->add(1, 3, g, {0.7f, 0.3f, 0.4f});
  l.data->set_partial_lod(partial);
  auto f = OverviewFigure::load(*l.data, l.sel, OverviewMetric::SinkMass);
  CHECK(f->thumbnails);
  CHECK(f->note.contains("3 of 8 heads"));
  for (int layer = 0; layer < spec.layers; ++layer)
    for (int head = 0; head < spec.heads; ++head) {
      const bool done = (layer == 0 && head == 1) || (layer == 1 && head >= 2);
      CHECK(f->thumbs[size_t(layer * spec.heads + head)].isNull() == !done);
    }
  CHECK(f->values[size_t(0 * spec.heads + 1)] == Approx(0.9f));
  CHECK(f->order[1].front() == 3);  // sink mass 0.7 sorts first in layer 1
}

namespace {

// A real stories260K capture of a short story prompt under `policy`; the
// trace's path.
std::string capture_lily(const std::string& policy, int max_new) {
  const std::string model = test::shared_dir() + "/models/stories260K";
  const std::string path = test::temp_dir() + "/lily.kvtrace.h5";
  std::string out;
  REQUIRE(test::run_command(test::kvscope_exe() + " capture --model " + model +
                                "/stories260K.bin --tokenizer " + model +
                                "/tok512.bin --prompt 'Once upon a time, there was a little "
                                "girl named Lily.' --policy " +
                                policy + " --max-new " + std::to_string(max_new) + " -q -o " + path,
                            &out) == 0);
  return path;
}

}  // namespace

TEST_CASE("timeline marks a policy's context-reconstruction steps (KVzip on stories260K)") {
  test::qt_app(true);
  std::vector<trace::StepRecord> steps(6);
  steps[2].kind = steps[3].kind = steps[5].kind = trace::StepKind::Reconstruction;
  CHECK(reconstruction_steps(steps) == StepRanges{{2, 4}, {5, 6}});
  auto reader = trace::TraceReader::open(capture_lily("kvzip", 6));
  TraceData data(*reader);
  auto f = TimelineFigure::load(data, selection_for(*reader, 0, 0, 3, -1), TimelineMode::Head);
  REQUIRE(f->reconstruction == StepRanges{{1, 2}});  // prefill, then KVzip's scoring pass
  QStringList texts;
  for (const DrawnText& t : check_layout(*f, ExportOptions{1000, 600, 96}).texts) texts << t.text;
  CHECK(texts.contains("context reconstruction (1 step)"));
  // The band is drawn over step 1 along the plot's top edge.
  const QImage img = render(*f, 1000, 600);
  const QRectF plot = f->plot_rect(QRectF(0, 0, 1000, 600));
  const QPointF c = f->cell_center(plot, 1, 0);
  CHECK(near(img.pixel(int(c.x()), int(plot.top()) + 2), kReconstructionColor, 10));
}

TEST_CASE("timeline tooltip names a token's merges (CaM on stories260K)") {
  test::qt_app(true);
  auto reader = trace::TraceReader::open(capture_lily("cam:budget=8,merge_budget=3", 8));
  TraceData data(*reader);
  auto f = TimelineFigure::load(data, selection_for(*reader, 0, 0, reader->n_steps() - 1, -1),
                                TimelineMode::Head);
  REQUIRE(!f->merges.empty());
  for (const trace::MergeRow& m : f->merges) {
    CHECK(m.layer == 0);
    CHECK(m.kv_head == 0);
  }
  const trace::MergeRow m = f->merges.front();
  // The merged token, hovered at the step it left: where its value went.
  const QString left = f->describe(m.step + 0.5, m.token + 0.5);
  INFO(left.toStdString());
  CHECK(left.contains(QString("value merged at step %1 into").arg(m.step)));
  CHECK(left.contains(QString::number(m.into)));
  // The absorbing token: whose value it took, and not before that step.
  const QString took = f->describe(m.step + 0.5, m.into + 0.5);
  INFO(took.toStdString());
  CHECK(took.contains(QString("absorbed the values of")));
  CHECK(took.contains(QString("%1 (step %2)").arg(m.token).arg(m.step)));
  CHECK_FALSE(f->describe(m.step - 0.5, m.into + 0.5).contains("absorbed"));
  // Absorbing entries are marked, one mark per (step, token), and keyed.
  std::set<std::pair<int32_t, int32_t>> absorbed;
  for (const trace::MergeRow& r : f->merges) absorbed.insert({r.step, r.into});
  const auto kind =
      std::find_if(f->mark_kinds.begin(), f->mark_kinds.end(),
                   [](const MarkClass& k) { return k.label == "absorbed a merged value"; });
  REQUIRE(kind != f->mark_kinds.end());
  CHECK(kind->count == int64_t(absorbed.size()));
  CHECK(f->mark_kinds.back().stall);  // stalls stay last
  QStringList texts;
  for (const DrawnText& t : check_layout(*f, ExportOptions{1000, 600, 96}).texts) texts << t.text;
  CHECK(texts.filter("absorbed a merged value").size() == 1);
}

TEST_CASE("head budgets show the current head's pruned key channels (ThinK on stories260K)") {
  test::qt_app(true);
  auto reader = trace::TraceReader::open(capture_lily("think:ratio=0.5,window=4", 3));
  REQUIRE(reader->n_pruned_key_channels() == 5 * 4 * 4);  // L x K heads, 4 of 8 channels each
  TraceData data(*reader);
  auto f = BudgetFigure::load(data, selection_for(*reader, 2, 2, reader->n_steps() - 1, -1));
  REQUIRE(f->prunes_channels);
  std::vector<int> want;
  for (const trace::KeyChannelRow& c : reader->pruned_key_channels())
    if (c.layer == 2 && c.kv_head == 1) want.push_back(c.channel);
  std::sort(want.begin(), want.end());
  CHECK(f->pruned_channels == want);
  // The prefill (step 0) pruned them: the strip shows them from step 0 on.
  CHECK(BudgetFigure::load(data, selection_for(*reader, 2, 2, 0, -1))->pruned_channels == want);
  for (QSize size : {QSize(1000, 600), QSize(700, 450), QSize(1600, 1000)}) {
    INFO(size.width() << "x" << size.height());
    const QRectF area(0, 0, size.width(), size.height());
    QStringList texts;
    for (const DrawnText& t :
         check_layout(*f, ExportOptions{size.width(), size.height(), 96}).texts)
      texts << t.text;
    // The longest wording that fits, never elided.
    CHECK(texts
              .filter(QRegularExpression("^(key channels of kv head 1: 4 of 8 pruned \\(dark\\)|4 "
                                         "of 8 key channels pruned \\(dark\\)|4/8 key channels "
                                         "pruned|4/8 pruned)$"))
              .size() == 1);
    const QRectF strip = f->channel_strip(area);
    REQUIRE(area.contains(strip));
    const QImage img = render(*f, size.width(), size.height());
    // The cells: the bottom part of the strip, 8 of them; pruned ones dark.
    const double y = strip.bottom() - 3, w = strip.width() / 8;
    for (int c = 0; c < 8; ++c) {
      const bool pruned = std::find(want.begin(), want.end(), c) != want.end();
      const QRgb px = img.pixel(int(strip.left() + (c + 0.5) * w), int(y));
      CHECK(near(px, pruned ? QColor(40, 40, 40) : QColor(205, 225, 240), 8));
    }
  }
  // CSV: the pruned channels of the head at the step.
  QString csv;
  QTextStream out(&csv);
  f->write_csv(out);
  out.flush();
  CHECK(csv.count(",pruned_key_channel,") == 4);
}
