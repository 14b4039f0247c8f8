// Every view exported headless to PNG, SVG and PDF, read back: size, the
// expected elements (title, axis labels, colour bar, images), and the CLI's
// errors for bad input.
#include <QFile>
#include <QImage>
#include <QSvgRenderer>
#include <QXmlStreamReader>
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/figure_factory.h"
#include "views/layout_check.h"
#include "views/view_registry.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct SvgContent {
  QSize size;
  int images = 0, texts = 0;
  QString all_text;
};

SvgContent read_svg(const QString& path) {
  QFile f(path);
  REQUIRE(f.open(QIODevice::ReadOnly));
  QXmlStreamReader xml(&f);
  SvgContent c;
  while (!xml.atEnd()) {
    xml.readNext();
    if (!xml.isStartElement()) continue;
    if (xml.name() == u"svg")
      c.size =
          QSize(xml.attributes().value("width").toString().remove("mm").toDouble() > 0 ? 1 : 0, 0);
    if (xml.name() == u"image") ++c.images;
    if (xml.name() == u"text") {
      ++c.texts;
      c.all_text += xml.readElementText(QXmlStreamReader::IncludeChildElements) + "\n";
    }
  }
  REQUIRE_FALSE(xml.hasError());
  return c;
}

std::string pdftotext(const std::string& pdf) {
  std::string out;
  REQUIRE(test::run_command("pdftotext -layout '" + pdf + "' -", &out) == 0);
  return out;
}

std::string pdf_page_size(const std::string& pdf) {
  std::string out;
  REQUIRE(test::run_command("pdfinfo '" + pdf + "'", &out) == 0);
  auto at = out.find("Page size:");
  REQUIRE(at != std::string::npos);
  return out.substr(at, out.find('\n', at) - at);
}

// Mean colour of each `block` x `block` square: antialiased edges and glyph
// hinting differ between rasterisers, the colour of what is drawn must not.
std::vector<QColor> block_means(const QImage& img, int block) {
  std::vector<QColor> out;
  for (int by = 0; by + block <= img.height(); by += block)
    for (int bx = 0; bx + block <= img.width(); bx += block) {
      double r = 0, g = 0, b = 0;
      for (int y = by; y < by + block; ++y)
        for (int x = bx; x < bx + block; ++x) {
          const QColor c = img.pixelColor(x, y);
          r += c.red();
          g += c.green();
          b += c.blue();
        }
      const double n = double(block * block);
      out.emplace_back(int(r / n), int(g / n), int(b / n));
    }
  return out;
}

// Share of blocks whose mean colour differs by more than `tolerance` in a channel.
double differing_blocks(const QImage& a, const QImage& b, int block, int tolerance) {
  const std::vector<QColor> ma = block_means(a, block), mb = block_means(b, block);
  REQUIRE(ma.size() == mb.size());
  int differ = 0;
  for (size_t i = 0; i < ma.size(); ++i)
    differ += std::abs(ma[i].red() - mb[i].red()) > tolerance ||
              std::abs(ma[i].green() - mb[i].green()) > tolerance ||
              std::abs(ma[i].blue() - mb[i].blue()) > tolerance;
  return double(differ) / double(ma.size());
}

}  // namespace

TEST_CASE("every view's PNG, SVG and PDF show the same text in the same colours") {
  test::qt_app(true);
  const std::string path = test::write_trace(test::with_needle(test::lod_spec(), 100, 8, 4));
  const std::string dir = test::temp_dir();
  auto reader = trace::TraceReader::open(path);
  TraceData data(*reader);
  auto other = trace::TraceReader::open(path);
  TraceData other_data(*other);
  FigureRequest q;
  q.selection = selection_for(*reader, 1, 2, 12, 40);
  const ExportOptions o{900, 600, 150};
  for (const ViewDescriptor& d : view_registry()) {
    q.view = d.name;
    std::shared_ptr<Figure> fig = make_figure(data, &other_data, q);
    const std::string base = dir + "/" + d.name.toStdString();
    export_figure(*fig, QString::fromStdString(base + ".png"), o);
    export_figure(*fig, QString::fromStdString(base + ".svg"), o);
    export_figure(*fig, QString::fromStdString(base + ".pdf"), o);
    INFO("view " << d.name.toStdString());
    // Text: the SVG holds exactly the strings the figure draws.
    QStringList drawn, in_svg;
    for (const DrawnText& t : check_layout(*fig, o).texts) drawn << t.text;
    const QString svg_text = read_svg(QString::fromStdString(base + ".svg")).all_text;
    in_svg = svg_text.split('\n', Qt::SkipEmptyParts);
    drawn.sort();
    in_svg.sort();
    CHECK(in_svg == drawn);
    // Colour: the SVG and the PDF rasterised at the PNG's size agree with it.
    const QImage png =
        QImage(QString::fromStdString(base + ".png")).convertToFormat(QImage::Format_RGB32);
    QImage svg(png.size(), QImage::Format_RGB32);
    svg.fill(Qt::white);
    {
      QPainter p(&svg);
      QSvgRenderer(QString::fromStdString(base + ".svg")).render(&p);
    }
    std::string log;
    REQUIRE(test::run_command(
                "pdftoppm -r 150 -png -singlefile '" + base + ".pdf' '" + base + "-pdf'", &log) ==
            0);
    const QImage pdf =
        QImage(QString::fromStdString(base + "-pdf.png")).convertToFormat(QImage::Format_RGB32);
    REQUIRE(pdf.size() == png.size());
    CHECK(differing_blocks(png, svg, 10, 24) < 0.03);
    CHECK(differing_blocks(png, pdf, 10, 24) < 0.03);
  }
}

TEST_CASE("every view exports to PNG, SVG and PDF with its title, axes and colour bar") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::lod_spec();
  spec.needle_begin = 100;  // a task's needle and question, for the needle view
  spec.needle_tokens = 8;
  spec.question_tokens = 4;
  std::string path = test::write_trace(spec);
  std::string dir = test::temp_dir();
  auto reader = trace::TraceReader::open(path);
  test::write_causal_report(path, reader->n_layers(), reader->n_kv_heads());
  TraceData data(*reader);
  auto other = trace::TraceReader::open(path);
  TraceData other_data(*other);
  FigureRequest q;
  q.selection = selection_for(*reader, 1, 2, 12, 40);  // a pooled head (dense: (0,0), (1,3))
  ExportOptions o{1200, 800, 150};
  // (view, words the figure must contain)
  std::vector<std::pair<QString, std::vector<std::string>>> views = {
      {"heatmap", {"Attention", "query token", "key token", "mean attention"}},
      {"timeline", {"Eviction timeline", "step", "token", "evicted"}},
      {"layers", {"Heads holding", "layer", "kv heads holding"}},
      {"budget", {"Head budgets", "kv head", "entries", "cold"}},
      {"survival", {"Survival", "horizon", "held by the policy"}},
      {"gates", {"Gate scores", "synthetic_gate", "threshold"}},
      // pdftotext reads DejaVu's "ff" as one ligature: words without it.
      {"cutoff", {"Eviction cut", "layer 1", "kv head 1", "step", "score", "outside window"}},
      {"tokens", {"Tokens", "p40"}},
      {"history", {"Token history", "token 40"}},
      {"forecast", {"Forecast vs attention", "forecast", "received attention", "step", "token 40"}},
      {"compare", {"Compare", "kept by A, not B"}},
      {"overview", {"Layers x heads"}},
      {"needle", {"Needle", "needle held", "attention mass", "step"}},
      {"causal", {"Causal map", "kv head", "layer", "log p gap recovered", "answer log p"}},
  };
  // Every registered view is exported here (a view added to the registry
  // without its words above fails), and export's list is the registry.
  QStringList listed;
  for (const auto& [view, words] : views) listed << view;
  QStringList registered;
  for (const ViewDescriptor& d : view_registry()) {
    registered << d.name;
    INFO("view " << d.name.toStdString());
    CHECK(listed.contains(d.name));
    CHECK(d.figure);
    CHECK(d.widget);
    if (!d.tab_with.isEmpty())
      CHECK(registered.contains(d.tab_with));  // tabbed with an earlier one
  }
  CHECK(registered.size() == listed.size());
  CHECK(figure_names() == registered);
  for (const auto& [view, words] : views) {
    q.view = view;
    std::shared_ptr<Figure> fig = make_figure(data, &other_data, q);
    std::string base = dir + "/" + view.toStdString();
    export_figure(*fig, QString::fromStdString(base + ".png"), o);
    export_figure(*fig, QString::fromStdString(base + ".svg"), o);
    export_figure(*fig, QString::fromStdString(base + ".pdf"), o);
    export_figure(*fig, QString::fromStdString(base + ".csv"), o);
    INFO("view " << view.toStdString());
    QImage png(QString::fromStdString(base + ".png"));
    REQUIRE(png.size() == QSize(1200, 800));
    CHECK(png.dotsPerMeterX() == Approx(150 / 0.0254).margin(1));
    // Not blank: many distinct colours.
    QSet<QRgb> colours;
    for (int y = 0; y < 800; y += 7)
      for (int x = 0; x < 1200; x += 7) colours.insert(png.pixel(x, y));
    CHECK(colours.size() > 5);
    SvgContent svg = read_svg(QString::fromStdString(base + ".svg"));
    CHECK(QSvgRenderer(QString::fromStdString(base + ".svg")).isValid());
    std::string pdf_text = pdftotext(base + ".pdf");
    CHECK(pdf_page_size(base + ".pdf").find("576 x 384 pts") != std::string::npos);  // 8 x 5.33 in
    CHECK(slurp(base + ".pdf").rfind("%PDF-", 0) == 0);
    for (const std::string& w : words) {
      INFO("word " << w);
      CHECK(svg.all_text.contains(QString::fromStdString(w)));
      CHECK(pdf_text.find(w) != std::string::npos);
    }
    if (view == "heatmap") CHECK(svg.images >= 2);  // the map and the colour bar
    std::string csv = slurp(base + ".csv");
    CHECK(csv.find('\n') != std::string::npos);
    CHECK(std::count(csv.begin(), csv.end(), '\n') > 3);
  }
}

TEST_CASE("kvscope export runs headless and names the field on bad input") {
  std::string path = test::write_trace(test::small_spec());
  std::string dir = test::temp_dir();
  std::string out;
  std::string exe = test::kvscope_exe();
  // No display at all: the export must not need one.
  std::string env = "env -u DISPLAY -u WAYLAND_DISPLAY ";
  REQUIRE(test::run_command(env + exe + " export " + path +
                                " --view heatmap --layer 3 --head 1 --step 30 -o " + dir +
                                "/fig.pdf",
                            &out) == 0);
  CHECK(out.find("wrote") != std::string::npos);
  CHECK(pdftotext(dir + "/fig.pdf").find("layer 3") != std::string::npos);
  CHECK(test::run_command(
            env + exe + " export " + path + " --view heatmap --layer 9 -o " + dir + "/x.png",
            &out) == 2);
  CHECK(out.find("--layer") != std::string::npos);
  CHECK(out.find("outside [0, 4)") != std::string::npos);
  CHECK(test::run_command(env + exe + " export " + path + " --view timeline -o " + dir + "/x.gif",
                          &out) == 2);
  CHECK(out.find(".gif") != std::string::npos);
  CHECK_FALSE(std::ifstream(dir + "/x.gif").good());  // nothing half-written
  CHECK(test::run_command(env + exe + " export " + path + " --view compare -o " + dir + "/c.png",
                          &out) == 2);
  CHECK(out.find("--compare") != std::string::npos);
  REQUIRE(test::run_command(
              exe + " export " + path + " --view perfetto --layers 1 -o " + dir + "/p.json",
              &out) == 0);
  nlohmann::json j = nlohmann::json::parse(slurp(dir + "/p.json"));
  CHECK(j["traceEvents"].size() > 100);
  // --series takes a name or an index of the trace's /series, nothing else.
  REQUIRE(test::run_command(env + exe + " export " + path +
                                " --view cutoff --series cutoff --layer 2 --head 5 -o " + dir +
                                "/cut.svg",
                            &out) == 0);
  CHECK(out.find("cutoff · layer 2 · kv head 2") != std::string::npos);
  CHECK(test::run_command(
            env + exe + " export " + path + " --view cutoff --series 1 -o " + dir + "/x.png",
            &out) == 2);
  CHECK(out.find("--series") != std::string::npos);
  CHECK(out.find("its series: cutoff") != std::string::npos);
  // --view forecast: a time-varying gate by name, a token in range.
  REQUIRE(
      test::run_command(env + exe + " export " + path +
                            " --view forecast --gate forecast --token 50 --layer 1 --head 2 -o " +
                            dir + "/forecast.csv",
                        &out) == 0);
  CHECK(slurp(dir + "/forecast.csv").find("\nsample,") != std::string::npos);
  CHECK(test::run_command(env + exe + " export " + path +
                              " --view forecast --gate bogus --token 5 -o " + dir + "/x.png",
                          &out) == 2);
  CHECK(out.find("--gate") != std::string::npos);
  CHECK(out.find("'bogus' is not a gate of the trace (its gates: synthetic_gate, forecast)") !=
        std::string::npos);
  CHECK(test::run_command(env + exe + " export " + path +
                              " --view forecast --gate synthetic_gate --token 5 -o " + dir +
                              "/x.png",
                          &out) == 2);
  CHECK(out.find("--gate") != std::string::npos);
  CHECK(out.find("no per-step samples (the trace's time-varying gates: forecast)") !=
        std::string::npos);
  CHECK(test::run_command(
            env + exe + " export " + path + " --view forecast --token 999 -o " + dir + "/x.png",
            &out) == 2);
  CHECK(out.find("--token") != std::string::npos);
  CHECK(out.find("999 is outside [0, 80)") != std::string::npos);
  CHECK(test::run_command(env + exe + " export " + path + " --view forecast -o " + dir + "/x.png",
                          &out) == 2);
  CHECK(out.find("--token") != std::string::npos);
  CHECK_FALSE(std::ifstream(dir + "/x.png").good());  // nothing written for any of them
  // --series for the budget view: a name, or none; a bad one names the option.
  REQUIRE(test::run_command(env + exe + " export " + path + " --view budget --series cutoff -o " +
                                dir + "/budget.csv",
                            &out) == 0);
  CHECK(slurp(dir + "/budget.csv").find(",series:cutoff,") != std::string::npos);
  CHECK(test::run_command(
            env + exe + " export " + path + " --view budget --series nope -o " + dir + "/x.png",
            &out) == 2);
  CHECK(out.find("--series") != std::string::npos);
}

TEST_CASE("the cutoff view of a trace without series says so in words, with no axes") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  spec.series = false;
  std::string path = test::write_trace(spec);
  auto reader = trace::TraceReader::open(path);
  REQUIRE(reader->series().empty());
  TraceData data(*reader);
  FigureRequest q;
  q.view = "cutoff";
  q.selection = selection_for(*reader, 1, 2, -1, -1);
  std::shared_ptr<Figure> fig = make_figure(data, nullptr, q);
  QString svg_path = QString::fromStdString(test::temp_dir() + "/no-series.svg");
  export_figure(*fig, svg_path, ExportOptions{900, 600, 96});
  SvgContent svg = read_svg(svg_path);
  CHECK(svg.all_text.contains("no per-step series"));
  CHECK(svg.all_text.contains("kvpop_cutoff"));
  // No empty axes: no axis label and no tick label.
  for (const QString& line : svg.all_text.split('\n')) {
    INFO("text " << line.toStdString());
    CHECK(line.trimmed() != "step");
    CHECK_FALSE(line.startsWith("score"));
    bool number = false;
    line.trimmed().toDouble(&number);
    CHECK_FALSE(number);
  }
  std::string csv_path = test::temp_dir() + "/no-series.csv";
  export_figure(*fig, QString::fromStdString(csv_path), ExportOptions{});
  std::string csv = slurp(csv_path);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 2);  // title and header only
}
