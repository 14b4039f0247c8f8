// The tier-aware views on a trace with a tier the attention does not read
// (format 1.3: /run tier_attended, /stalls): the timeline's stall and
// promotion marks at their (step, token), the forecast view's samples and
// received attention of one token, the budget view's per-head series.
// The trace is the synthetic policy's, with scripted promotions and forecast
// samples added, so every expected value is known before it is read back.
#include <QImage>
#include <QPainter>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "core/trace/synthetic.h"
#include "core/trace/writer.h"
#include "tests/views/qt_app.h"
#include "tests/views/synthetic_fixture.h"
#include "views/budget_figure.h"
#include "views/figure_factory.h"
#include "views/forecast_figure.h"
#include "views/timeline_figure.h"

using namespace kvscope;
using namespace kvscope::views;

namespace {

// Head (1, 2) of small_spec: window 24, so token 30 leaves the hot window at
// step 7 (demoted to tier 1, which this trace does not attend) and is
// evicted at step 31. The script promotes it back twice.
constexpr int kLayer = 1, kKv = 2, kHead = 4;  // query head 4 -> kv head 2
constexpr int32_t kToken = 30;
const std::vector<std::pair<int32_t, float>> kScriptedSamples = {
    {5, 0.2f}, {12, 0.8f}, {19, 0.35f}, {26, 0.9f}};
const char* kLanded = "promoted: prefetch landed (speculative, in time)";
const char* kReactive = "promoted: reactive fetch (the step stalled)";

trace::SyntheticSpec tiered_spec() {
  trace::SyntheticSpec s = test::small_spec();
  s.tiers = 2;
  s.cold_attended = false;
  return s;
}

struct Scripted {
  std::string path;
  std::vector<trace::StepData> steps;              // what the writer was handed
  std::vector<std::pair<int32_t, float>> samples;  // forecast samples of the token at the head
};

// The synthetic capture plus: promotions of token 30 at head (1, 2) at steps
// 12 (landed) and 20 (reactive), demotions back at 15 and 22, and forecast
// samples at kScriptedSamples; the series renamed `series_name`.
Scripted write_scripted(const std::string& series_name = "cutoff") {
  trace::SyntheticSpec spec = tiered_spec();
  trace::SyntheticCapture capture(spec);
  trace::RunInfo run = capture.run();
  const uint16_t landed = uint16_t(run.reason_names.size());
  run.reason_names.push_back(kLanded);
  run.reason_names.push_back(kReactive);
  trace::CaptureLayout layout = capture.layout();
  layout.series[0].name = series_name;
  Scripted out;
  out.path = test::temp_dir() + "/tiered.h5";
  auto writer = trace::TraceWriter::create(out.path, run, layout);
  auto move = [](int32_t s, trace::EventKind kind, uint8_t from, uint8_t to, uint16_t reason) {
    return trace::Event{s, int16_t(kLayer), int16_t(kKv), kToken, kind, 0.5f, reason, from, to};
  };
  for (int64_t s = 0; s < capture.n_steps(); ++s) {
    trace::StepData sd = capture.step(s);
    int32_t step = int32_t(s);
    if (s == 12) sd.events.push_back(move(step, trace::EventKind::Promote, 1, 0, landed));
    if (s == 20) sd.events.push_back(move(step, trace::EventKind::Promote, 1, 0, landed + 1));
    if (s == 15 || s == 22) sd.events.push_back(move(step, trace::EventKind::Demote, 0, 1, 1));
    for (const trace::GateValue& g : sd.gates)
      if (g.gate == 1 && g.layer == kLayer && g.kv_head == kKv && g.token == kToken)
        out.samples.push_back({step, g.value});
    for (const auto& [at, value] : kScriptedSamples)
      if (at == s) {
        sd.gates.push_back(trace::GateValue{1, int16_t(kLayer), int16_t(kKv), kToken, value, true});
        out.samples.push_back({at, value});
      }
    writer->append_step(sd);
    out.steps.push_back(std::move(sd));
  }
  writer->close(trace::GenerationSummary{});
  return out;
}

struct Opened {
  std::unique_ptr<trace::TraceReader> reader;
  std::unique_ptr<TraceData> data;
  Selection sel;
};

Opened open(const std::string& path, int layer, int head, int64_t step, int64_t token) {
  Opened o;
  o.reader = trace::TraceReader::open(path);
  o.data = std::make_unique<TraceData>(*o.reader);
  o.sel = selection_for(*o.reader, layer, head, step, token);
  return o;
}

QImage render(const Figure& f, int w, int h) {
  QImage img(w, h, QImage::Format_ARGB32);
  img.fill(Qt::white);
  QPainter p(&img);
  p.setRenderHint(QPainter::Antialiasing);
  f.paint(p, QRectF(0, 0, w, h));
  return img;
}

bool near(QRgb a, QColor b, int tol = 6) {
  return std::abs(qRed(a) - b.red()) <= tol && std::abs(qGreen(a) - b.green()) <= tol &&
         std::abs(qBlue(a) - b.blue()) <= tol;
}

std::string csv_of(const Figure& f) {
  QString text;
  QTextStream out(&text);
  f.write_csv(out);
  out.flush();
  return text.toStdString();
}

// Rows of the CSV table that starts after the header line `header`.
std::vector<std::vector<std::string>> table(const std::string& csv, const std::string& header) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(csv);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == header) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line.empty() || line[0] == '#') break;
    std::vector<std::string> cells;
    std::istringstream cols(line);
    std::string cell;
    while (std::getline(cols, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

std::vector<trace::StallRow> truth_stalls(int layer, int kv) {
  std::vector<trace::StallRow> out;
  trace::SyntheticSpec spec = tiered_spec();
  for (int64_t s = 0; s < trace::SyntheticCapture(spec).n_steps(); ++s)
    for (const trace::StallRow& r : trace::synthetic_stalls(spec, s))
      if (r.layer == layer && r.kv_head == kv) out.push_back(r);
  return out;
}

}  // namespace

TEST_CASE("timeline: stalls and promotions marked at their (step, token), unread tier hatched") {
  test::qt_app(true);
  Scripted sc = write_scripted();
  Opened o = open(sc.path, kLayer, kHead, 2, -1);
  auto f = TimelineFigure::load(*o.data, o.sel, TimelineMode::Head);
  REQUIRE(f->kv_head == kKv);
  CHECK(f->tier_attended == std::vector<uint8_t>{1, 0});
  CHECK(f->title().startsWith("Tier timeline"));
  // The head's stalls are the synthetic policy's, in step order.
  std::vector<trace::StallRow> truth = truth_stalls(kLayer, kKv);
  REQUIRE(truth.size() >= 3);
  REQUIRE(f->stalls.size() == truth.size());
  for (size_t i = 0; i < truth.size(); ++i) {
    CHECK(f->stalls[i].step == truth[i].step);
    CHECK(f->stalls[i].token == truth[i].token);
  }
  // The two scripted promotions, one class per reason, the stalls last.
  REQUIRE(f->promotions.size() == 2);
  REQUIRE(f->mark_kinds.size() == 3);
  CHECK(f->mark_kinds[0].label == kLanded);
  CHECK(f->mark_kinds[0].short_label == "prefetch landed");
  CHECK(f->mark_kinds[1].short_label == "reactive fetch");
  CHECK(f->mark_kinds[0].color != f->mark_kinds[1].color);
  CHECK(f->mark_kinds[2].stall);
  CHECK(f->mark_kinds[2].count == int64_t(truth.size()));

  // Drawn: a vermillion stall at each stall's cell, the class colour at each
  // promotion's, the hatched grey of the unread tier where the token is
  // cold and nothing is marked, and no stall colour there.
  const int W = 1000, H = 800;
  QImage img = render(*f, W, H);
  QRectF plot = f->plot_rect(QRectF(0, 0, W, H));
  for (const trace::StallRow& s : truth) {
    INFO("stall at step " << s.step << ", token " << s.token);
    CHECK(near(img.pixel(f->cell_center(plot, s.step, s.token).toPoint()), palette::kVermillion));
  }
  CHECK(near(img.pixel(f->cell_center(plot, 12, kToken).toPoint()), f->mark_kinds[0].color));
  CHECK(near(img.pixel(f->cell_center(plot, 20, kToken).toPoint()), f->mark_kinds[1].color));
  QRgb cold = img.pixel(f->cell_center(plot, 9, kToken).toPoint());
  CHECK((near(cold, unattended::kFill, 2) || near(cold, unattended::kHatch, 2)));
  // Hot again between the promotion at 12 and the demotion at 15.
  CHECK(f->cell_color(13, kToken) == palette::tier(0));
  CHECK(f->cell_color(16, kToken) == unattended::kFill);

  // Many marks fold into the raster's cells instead of glyphs: every cell of
  // tokens 40..47 at steps 1..32 a stall, drawn in stall colour cell by cell.
  auto dense = TimelineFigure::load(*o.data, o.sel, TimelineMode::Head);
  const uint8_t stall = uint8_t(dense->mark_kinds.size() - 1);
  dense->marks.clear();
  for (int32_t s = 1; s <= 32; ++s)
    for (int32_t t = 40; t < 48; ++t) dense->marks.push_back({s, t, stall});
  CHECK(TimelineFigure::dense_marks(256, 3.4, QRectF(0, 0, 200, 200)));
  const int w = 300, h = 260;
  QImage small = render(*dense, w, h);
  QRectF sp = dense->plot_rect(QRectF(0, 0, w, h));
  REQUIRE(TimelineFigure::dense_marks(256, 3.4, sp));
  CHECK(near(small.pixel(dense->cell_center(sp, 20, 44).toPoint()), palette::kVermillion));
  CHECK_FALSE(
      near(small.pixel(dense->cell_center(sp, 20, 36).toPoint()), palette::kVermillion, 40));

  // The CSV has the stall rows of the head, as the trace holds them.
  std::string csv = csv_of(*f);
  auto rows = table(csv, "stall_step,token,wait_s,needed");
  REQUIRE(rows.size() == truth.size());
  for (size_t i = 0; i < truth.size(); ++i) {
    CHECK(std::stoi(rows[i][0]) == truth[i].step);
    CHECK(std::stoi(rows[i][1]) == truth[i].token);
    CHECK(std::stof(rows[i][2]) == Approx(truth[i].wait_s).epsilon(1e-5));
    CHECK(std::stoi(rows[i][3]) == truth[i].needed);
  }
  auto promotions = table(csv, "promote_step,token,from_tier,to_tier,reason");
  REQUIRE(promotions.size() == 2);
  CHECK(promotions[1][0] == "20");
  CHECK(promotions[1][4] == std::string("\"") + kReactive + "\"");
}

TEST_CASE("forecast: a token's gate samples and received attention, its tiers and marks") {
  test::qt_app(true);
  Scripted sc = write_scripted();
  Opened o = open(sc.path, kLayer, kHead, 10, kToken);
  auto f = ForecastFigure::load(*o.data, o.sel);  // the first time-varying gate
  REQUIRE(f->gate_name == "forecast");
  CHECK(f->gate_choice_names == QStringList{"forecast"});
  REQUIRE(f->token == kToken);
  CHECK(f->has_received);
  // The samples are the token's at this head, written at admission and by
  // the script; none of other heads or tokens.
  REQUIRE(sc.samples.size() == kScriptedSamples.size() + 1);
  REQUIRE(f->samples.size() == sc.samples.size());
  for (size_t i = 0; i < sc.samples.size(); ++i) {
    CHECK(f->samples[i].first == sc.samples[i].first);
    CHECK(f->samples[i].second == sc.samples[i].second);
  }
  // Received attention per step: the writer's row for the head, or nothing
  // when the token was not attended (tier 1 is not read).
  auto received_truth = [&](size_t s) -> float {
    for (const trace::ReceivedRow& row : sc.steps[s].received)
      if (row.layer == kLayer && row.kv_head == kKv)
        for (size_t i = 0; i < row.tokens.size(); ++i)
          if (row.tokens[i] == kToken) return row.mass[i];
    return NAN;
  };
  std::string csv = csv_of(*f);
  auto rows = table(csv, "kind,step,end_step,value,detail");
  std::vector<std::vector<std::string>> samples, received, tiers, promotes, stalls;
  for (const auto& r : rows) {
    if (r[0] == "sample") samples.push_back(r);
    if (r[0] == "received") received.push_back(r);
    if (r[0] == "tier") tiers.push_back(r);
    if (r[0] == "promote") promotes.push_back(r);
    if (r[0] == "stall") stalls.push_back(r);
  }
  REQUIRE(samples.size() == sc.samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    CHECK(std::stoi(samples[i][1]) == sc.samples[i].first);
    CHECK(std::stof(samples[i][3]) == Approx(sc.samples[i].second).epsilon(1e-5));
    CHECK(samples[i][4] == "forecast");
  }
  REQUIRE(received.size() == sc.steps.size());  // token 30 is fed at step 0
  int64_t attended = 0, unread = 0;
  for (size_t s = 0; s < received.size(); ++s) {
    INFO("step " << s);
    CHECK(std::stoul(received[s][1]) == s);
    float truth = received_truth(s);
    if (std::isnan(truth)) {
      CHECK(received[s][3].empty());
      ++unread;
    } else {
      REQUIRE_FALSE(received[s][3].empty());
      CHECK(std::stof(received[s][3]) == Approx(truth).epsilon(1e-5));
      ++attended;
    }
  }
  CHECK(attended >= 7);  // hot until step 7
  CHECK(unread >= 20);   // in the unread tier from 7 to 31, evicted after
  // Tier bands: hot, cold, hot again after each promotion, evicted at 31.
  std::vector<std::string> bands;
  for (const auto& r : tiers) bands.push_back(r[1] + "-" + r[2] + " " + r[4]);
  CHECK(bands == std::vector<std::string>{"0-7 hot", "7-12 cold", "12-15 hot", "15-20 cold",
                                          "20-22 hot", "22-31 cold", "31-33 evicted"});
  REQUIRE(promotes.size() == 2);
  CHECK(promotes[0][1] == "12");
  std::vector<trace::StallRow> truth_all = truth_stalls(kLayer, kKv);
  size_t mine = size_t(std::count_if(truth_all.begin(), truth_all.end(),
                                     [](const trace::StallRow& r) { return r.token == kToken; }));
  CHECK(stalls.size() == mine);

  // Drawn: the step line passes through each sample's value; folded to
  // fewer columns than samples it still spans their range.
  QRectF area(0, 0, 1000, 700);
  ForecastFigure::Layout l = f->layout(area);
  CHECK(l.legend.bottom() <= l.lane.top());
  CHECK(l.gate_plot.bottom() < l.received_plot.top());
  std::vector<QPolygonF> line = f->gate_line(l.gate_plot, int(l.gate_plot.width()));
  REQUIRE(line.size() == 1);
  REQUIRE(line[0].size() == 2 * int(sc.samples.size()));
  plot::Map my{f->gate_lo, f->gate_hi, l.gate_plot.bottom(), l.gate_plot.top()};
  for (size_t i = 0; i < sc.samples.size(); ++i)
    CHECK(line[0][int(2 * i)].y() == Approx(my(sc.samples[i].second)));
  std::vector<QPolygonF> folded = f->gate_line(l.gate_plot, 3);
  REQUIRE(folded.size() == 1);
  CHECK(folded[0].size() <= 6);
  double top = INFINITY, bottom = -INFINITY;
  for (const QPointF& pt : folded[0])
    top = std::min(top, pt.y()), bottom = std::max(bottom, pt.y());
  float lo = INFINITY, hi = -INFINITY;
  for (const auto& smp : sc.samples) lo = std::min(lo, smp.second), hi = std::max(hi, smp.second);
  CHECK(top == Approx(my(hi)));
  CHECK(bottom == Approx(my(lo)));
  CHECK(f->step_at(area, QPointF(f->x_map(l.gate_plot)(17), l.gate_plot.center().y())) == 17);
}

TEST_CASE("forecast: words where there is no gate, no token, or no received attention") {
  test::qt_app(true);
  trace::SyntheticSpec spec = test::small_spec();
  spec.received = false;
  Opened o = open(test::write_trace(spec, "no-received.h5"), 0, 0, 5, 10);
  auto f = ForecastFigure::load(*o.data, o.sel);
  CHECK_FALSE(f->has_received);
  std::string csv = csv_of(*f);
  CHECK(csv.find("\nreceived,") == std::string::npos);
  QString svg = QString::fromStdString(test::temp_dir() + "/no-received.svg");
  export_figure(*f, svg, ExportOptions{900, 600, 96});
  std::ifstream in(svg.toStdString());
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text.find("no received attention") != std::string::npos);
  Selection none = o.sel;
  none.tokens.clear();
  CHECK(ForecastFigure::load(*o.data, none)->token == -1);
  spec.gates = false;
  Opened g = open(test::write_trace(spec, "no-gates.h5"), 0, 0, 5, 10);
  CHECK(ForecastFigure::load(*g.data, g.sel)->gate == -1);
}

TEST_CASE("budget: each head's series over steps with the hot tier, legend clear of the plot") {
  test::qt_app(true);
  Scripted sc = write_scripted("synthetic_hot_budget");
  trace::SyntheticSpec spec = tiered_spec();
  Opened o = open(sc.path, kLayer, kHead, 12, -1);
  // By default the series named *hot_budget*; "none" shows entries by tier.
  auto f = BudgetFigure::load(*o.data, o.sel);
  REQUIRE(f->shown_series == 0);
  CHECK(f->series_name == "synthetic_hot_budget");
  CHECK(BudgetFigure::load(*o.data, o.sel, BudgetFigure::kNoSeries)->shown_series == -1);
  REQUIRE(f->head_series.size() == size_t(spec.kv_heads));
  for (int k = 0; k < spec.kv_heads; ++k)
    for (int64_t s = 0; s < f->n_steps; ++s) {
      float truth = trace::synthetic_series(spec, s, kLayer, k);
      float v = f->head_series[size_t(k)][size_t(s)];
      INFO("kv head " << k << " step " << s);
      CHECK((std::isnan(truth) ? std::isnan(v) : v == truth));
    }
  for (int l = 0; l < spec.layers; ++l)
    for (int k = 0; k < spec.kv_heads; ++k) {
      float truth = trace::synthetic_series(spec, 12, l, k);
      CHECK((std::isnan(truth) ? std::isnan(f->grid_value(l, k)) : f->grid_value(l, k) == truth));
    }
  std::string csv = csv_of(*f);
  CHECK(csv.find("\n3,1,2,series:synthetic_hot_budget,") != std::string::npos);
  // The legend sits above the plot at every size, inside the figure.
  for (QSizeF size : {QSizeF(500, 350), QSizeF(900, 600), QSizeF(1400, 900)}) {
    INFO("size " << size.width() << " x " << size.height());
    QImage img(size.toSize(), QImage::Format_ARGB32);
    for (int mode : {0, BudgetFigure::kNoSeries}) {
      auto g = BudgetFigure::load(*o.data, o.sel, mode);
      BudgetFigure::Layout l = g->series_layout(QRectF(QPointF(0, 0), size), &img);
      CHECK(l.legend.bottom() < l.plot.top());
      CHECK(l.legend.right() <= size.width());
      CHECK(l.plot.right() <= size.width());
      CHECK(l.plot.bottom() <= size.height());
      CHECK(l.plot.left() > g->grid_cell(QRectF(QPointF(0, 0), size), 0, 3).right() + 40);
    }
  }
}
