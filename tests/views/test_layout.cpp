// The layout test: every view, painted as an export at window sizes and at a
// paper column, draws no text that is clipped or overlaps other text (the
// recording paint device of views/layout_check knows every text rectangle),
// and its plot is not blank. The GUI test does the same for the docks of the
// real window.
#include <QImage>
#include <QRegularExpression>
#include <QSet>
#include <catch2/catch.hpp>

#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/figure_factory.h"
#include "views/layout_check.h"
#include "views/view_registry.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

struct Page {
  const char* name;
  ExportOptions options;
};

// Window sizes at screen resolution, the export default (150 dpi) and every
// export preset (a paper column, the paper's width, a slide).
const std::vector<Page>& pages() {
  static const std::vector<Page> all = [] {
    std::vector<Page> out = {{"1280x800", {1280, 800, 96}},
                             {"1600x1000", {1600, 1000, 96}},
                             {"1920x1080", {1920, 1080, 96}},
                             {"1600x1000@150dpi", {1600, 1000, 150}}};
    for (const ExportPreset& p : export_presets()) out.push_back({p.name, p.options});
    CHECK(out.back().options.width == 1920);  // the presets are there
    return out;
  }();
  return all;
}

// Distinct colours on a grid over the page: a blank or one-colour plot has few.
int distinct_colours(const Figure& figure, const ExportOptions& o) {
  QImage img(o.width, o.height, QImage::Format_ARGB32);
  img.fill(Qt::white);
  {
    QPainter p(&img);
    paint_page(figure, p, o);
  }
  QSet<QRgb> colours;
  for (int y = 0; y < o.height; y += 5)
    for (int x = 0; x < o.width; x += 5) colours.insert(img.pixel(x, y));
  return int(colours.size());
}

void check_every_view(const std::string& path, const std::string& label) {
  auto reader = trace::TraceReader::open(path);
  test::write_causal_report(path, reader->n_layers(), reader->n_kv_heads());
  TraceData data(*reader);
  auto other = trace::TraceReader::open(path);
  TraceData other_data(*other);
  FigureRequest q;
  q.selection = selection_for(*reader, 1, 2, reader->n_steps() / 2, reader->n_tokens() / 5);
  for (const ViewDescriptor& d : view_registry()) {
    q.view = d.name;
    std::shared_ptr<Figure> fig = make_figure(data, &other_data, q);
    for (const Page& page : pages()) {
      INFO(label << " · view " << d.name.toStdString() << " · " << page.name);
      LayoutReport report = check_layout(*fig, page.options);
      for (const QString& problem : report.problems) UNSCOPED_INFO(problem.toStdString());
      CHECK(report.problems.empty());
      CHECK(report.texts.size() >= 3);  // a title and two axis labels at least
      CHECK(distinct_colours(*fig, page.options) > 5);
    }
  }
}

}  // namespace

TEST_CASE("layout: every view at every page size draws its text unclipped and apart") {
  test::qt_app(true);
  check_every_view(test::write_trace(test::with_needle(test::lod_spec(), 100, 8, 4)),
                   "synthetic 2x2 heads, 256 tokens");
}

TEST_CASE("layout: every view of a SmolLM2-shaped trace (30 layers, 1K tokens) fits") {
  test::qt_app(true);
  // The long axes and many heads that thin ticks and legends must survive,
  // with a 26-token needle at depth 0.5 and a question.
  check_every_view(
      test::write_trace(test::with_needle(test::smollm2_like_spec(), 480, 26, 20), "smollm2.h5"),
      "synthetic 30x3 kv heads, 1024 tokens");
}

TEST_CASE("layout: a zoomed heatmap's token labels and axis titles fit every page") {
  test::qt_app(true);
  const std::string path = test::write_trace(test::with_needle(test::lod_spec(), 100, 8, 4));
  auto reader = trace::TraceReader::open(path);
  TraceData data(*reader);
  FigureRequest q;
  q.view = "heatmap";
  q.selection = selection_for(*reader, 1, 2, reader->n_steps() - 1, -1);
  q.viewport = QRectF(90, 95, 30, 30);  // keys 90..120, queries 95..125: 9+ px a token
  std::shared_ptr<Figure> fig = make_figure(data, nullptr, q);
  for (const Page& page : pages()) {
    INFO("zoomed heatmap · " << page.name);
    LayoutReport report = check_layout(*fig, page.options);
    for (const QString& problem : report.problems) UNSCOPED_INFO(problem.toStdString());
    CHECK(report.problems.empty());
    QStringList texts;
    for (const DrawnText& t : report.texts) texts << t.text;
    CHECK(texts.contains("key token"));
    CHECK(texts.contains("query token"));
    // Token labels where 30 tokens get 9 px each (not on a paper column:
    // ticks there).
    if (page.options.width * 96.0 / page.options.dpi >= 600)
      CHECK(texts.filter(QRegularExpression("^1[01][0-9]( |$)")).size() >= 10);
  }
}
