#include "views/causal_figure.h"

#include <QDir>
#include <QFileInfo>
#include <QTextStream>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/analysis/causal_search.h"
#include "core/common/input_error.h"
#include "views/colormap.h"
#include "views/legend.h"

namespace kvscope::views {

namespace {

const QColor kUnmeasured{232, 232, 232};

// causal.json beside the trace (TRACE.causal/), or in the replay's own folder.
QString report_path(const std::string& trace) {
  const QString own = QString::fromStdString(trace) + ".causal/causal.json";
  if (QFileInfo::exists(own)) return own;
  const QString here = QFileInfo(QString::fromStdString(trace)).dir().filePath("causal.json");
  return QFileInfo::exists(here) ? here : QString();
}

double number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
}

}  // namespace

struct CausalFigure::Layout {
  QRectF grid, bar, keys, replays;  // replays: empty when the page is too narrow for them
  std::vector<LegendEntry> key;
  double cw = 0, ch = 0;
};

namespace {

const QColor kRecovered = palette::kGreen;

std::vector<LegendEntry> key_entries(bool replays) {
  std::vector<LegendEntry> key = {legend_box("minimal set (outlined)", palette::kVermillion),
                                  legend_box("layer's value (hatched)", QColor(170, 170, 170)),
                                  legend_box("not measured", kUnmeasured)};
  if (replays)
    for (LegendEntry e :
         {legend_box("replay that recovers", kRecovered),
          legend_line("policy's run", QPen(palette::kGrey, 1.5, Qt::DashLine)),
          legend_line("every loss restored", QPen(kRecovered, 1.5, Qt::DashLine)),
          legend_line("recovery threshold", QPen(palette::kVermillion, 1.5, Qt::DotLine))})
      key.push_back(e);
  return key;
}

// The verdict among the search's lines (the first ones give the runs' log p).
QString verdict_of(const std::string& words) {
  size_t start = 0;
  while (start < words.size()) {
    const size_t end = std::min(words.find('\n', start), words.size());
    const std::string line = words.substr(start, end - start);
    if (line.rfind("restoring", 0) == 0 || line.rfind("the budget", 0) == 0)
      return QString::fromStdString(line);
    start = end + 1;
  }
  return {};
}

}  // namespace

std::shared_ptr<CausalFigure> CausalFigure::load(TraceData& data) {
  auto f = std::make_shared<CausalFigure>();
  const trace::TraceReader& r = data.reader();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  f->cells.assign(size_t(f->layers * f->kv_heads), Cell{});
  const QString path = report_path(r.path());
  if (path.isEmpty()) return f;
  nlohmann::json j;
  try {
    std::ifstream in(path.toStdString());
    j = nlohmann::json::parse(in);
    if (!j.is_object()) throw std::out_of_range("not an object");
  } catch (const std::exception& e) {
    throw InputError(path.toStdString(), "", std::string("is not the search's JSON: ") + e.what());
  }
  if (j.value("n_layers", int64_t(0)) != f->layers ||
      j.value("kv_heads", int64_t(0)) != f->kv_heads)
    throw InputError(path.toStdString(), "n_layers",
                     "the search ran on another model shape than the trace's " +
                         std::to_string(f->layers) + " x " + std::to_string(f->kv_heads));
  try {
    f->read_report(j);
  } catch (const std::exception& e) {
    throw InputError(path.toStdString(), "", std::string("is not the search's JSON: ") + e.what());
  }
  f->folder = QFileInfo(path).absolutePath();
  return f;
}

// The cell of (layer, kv head) named in the report; throws when outside the shape.
CausalFigure::Cell& CausalFigure::cell(int64_t layer, int64_t kv_head) {
  if (layer < 0 || layer >= layers || kv_head < 0 || kv_head >= kv_heads)
    throw std::out_of_range("head " + std::to_string(layer) + "." + std::to_string(kv_head) +
                            " is outside the " + std::to_string(layers) + " x " +
                            std::to_string(kv_heads) + " model");
  return cells[size_t(layer * kv_heads + kv_head)];
}

void CausalFigure::read_report(const nlohmann::json& j) {
  original = number(j.at("original"), "logprob");
  full = number(j.at("full_restoration"), "logprob");
  recoverable = j.value("recoverable", false);
  replays = j.value("replays", int64_t(0));
  threshold = number(j, "threshold_logprob");
  words = verdict_of(j.value("words", std::string()));
  for (const auto& rp : j.value("replay_list", nlohmann::json::array()))
    replay_list.push_back({number(rp.at("effect"), "logprob"), rp.value("recovered", false)});
  for (const auto& l : j.value("layers", nlohmann::json::array())) {
    if (!l.at("restore_alone").is_object()) continue;
    for (int64_t k = 0; k < kv_heads; ++k) {
      Cell& c = cell(l.at("layer").get<int64_t>(), k);
      c.measured = Measured::Layer;
      c.logprob = number(l["restore_alone"], "logprob");
      c.trace = l.value("restore_trace", std::string());
    }
  }
  for (const auto& h : j.value("heads", nlohmann::json::array())) {
    if (!h.at("restore_alone").is_object()) continue;
    Cell& c = cell(h.at("layer").get<int64_t>(), h.at("kv_head").get<int64_t>());
    c.measured = Measured::Head;
    c.logprob = number(h["restore_alone"], "logprob");
    c.trace = h.value("restore_trace", std::string());
  }
  for (const auto& name : j.value("minimal_set", nlohmann::json::array())) {
    int64_t l = -1, k = -1;
    analysis::parse_head_name(name.get<std::string>(), &l, &k);  // none: -1, refused by cell()
    cell(l, k).minimal = true;
  }
}

QString CausalFigure::title() const {
  return "Causal map · restoring one head's (or layer's) losses alone";
}

QString CausalFigure::missing_data() const {
  return folder.isEmpty()
             ? "no causal search beside this trace: `kvscope why TRACE --causal` writes "
               "TRACE.causal/"
             : QString();
}

double CausalFigure::share(const Cell& c) const {
  const double gap = full - original;
  if (c.measured == Measured::None || !(gap > 0) || std::isnan(c.logprob)) return std::nan("");
  return std::clamp((c.logprob - original) / gap, 0.0, 1.0);
}

CausalFigure::Layout CausalFigure::layout(const QRectF& area) const {
  Layout l;
  // The replays' panel takes what the grid leaves, when that is wide enough to read.
  const bool panel = !replay_list.empty() && area.width() - 174 >= 560;
  l.key = key_entries(panel);
  const double lh = legend_height(l.key, area.width() - 16);
  l.keys = QRectF(area.left() + 8, area.bottom() - lh - 4, area.width() - 16, lh);
  QRectF inner = area.adjusted(64, 58, -110, -(48 + lh + 8));
  const double grid_room = panel ? inner.width() * 0.35 : inner.width();
  const double cell = std::min(grid_room / double(std::max<int64_t>(1, kv_heads)),
                               inner.height() / double(std::max<int64_t>(1, layers)));
  l.cw = std::min(cell * 1.6, grid_room / double(std::max<int64_t>(1, kv_heads)));
  l.ch = cell;
  l.grid = QRectF(inner.left(), inner.top(), l.cw * double(kv_heads), l.ch * double(layers));
  l.bar = QRectF(l.grid.right() + 16, l.grid.top(), 10, std::max(40.0, l.grid.height()));
  if (panel) {
    const double left = l.bar.right() + 160;  // the bar's ticks and title, the panel's
    l.replays = QRectF(left, inner.top(), area.right() - 24 - left, inner.height());
  }
  return l;
}

void CausalFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(),
              folder.isEmpty() ? QString() : QString("%1 replays · %2").arg(replays).arg(words));
  if (!missing_data().isEmpty())
    return plot::message(p, area.adjusted(8, 36, -8, -8), missing_data());
  const Layout l = layout(area);
  ColorScale cs;
  cs.map = ColorMapId::Viridis;
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t k = 0; k < kv_heads; ++k) {
      const Cell& c = cells[size_t(layer * kv_heads + k)];
      const QRectF r(l.grid.left() + double(k) * l.cw, l.grid.top() + double(layer) * l.ch, l.cw,
                     l.ch);
      const double s = share(c);
      p.fillRect(r.adjusted(0, 0, 0.3, 0.3),
                 std::isnan(s) ? kUnmeasured : QColor(cs.color(float(s))));
      if (c.measured == Measured::Layer)
        p.fillRect(r, QBrush(QColor(255, 255, 255, 110), Qt::BDiagPattern));
    }
  p.setBrush(Qt::NoBrush);
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t k = 0; k < kv_heads; ++k)
      if (cells[size_t(layer * kv_heads + k)].minimal) {
        p.setPen(QPen(palette::kVermillion, std::clamp(l.ch / 6, 1.5, 3.0)));
        p.drawRect(QRectF(l.grid.left() + double(k) * l.cw, l.grid.top() + double(layer) * l.ch,
                          l.cw, l.ch)
                       .adjusted(1, 1, -1, -1));
      }
  plot::axes(p, l.grid, 0, double(kv_heads), 0, double(layers), "kv head", "layer", true);
  plot::colorbar(p, l.bar, cs, "log p gap recovered");
  if (!l.replays.isEmpty()) paint_replays(p, l.replays);
  paint_legend_rows(p, l.keys, l.key);
}

// Every replay's answer log p in the order the search ran them, against the
// policy's run, the full restoration and the recovery threshold.
void CausalFigure::paint_replays(QPainter& p, const QRectF& r) const {
  double lo = std::min(original, full), hi = std::max(original, full);
  for (const Replay& x : replay_list)
    if (!std::isnan(x.logprob)) lo = std::min(lo, x.logprob), hi = std::max(hi, x.logprob);
  if (!(hi > lo)) hi = lo + 1;
  const double pad = 0.06 * (hi - lo);
  const double n = double(std::max<size_t>(1, replay_list.size()));
  plot::Map mx{-0.5, n - 0.5, r.left(), r.right()};
  plot::Map my{lo - pad, hi + pad, r.bottom(), r.top()};
  auto level = [&](double y, const QPen& pen) {
    if (std::isnan(y)) return;
    p.setPen(pen);
    p.drawLine(QPointF(r.left(), my(y)), QPointF(r.right(), my(y)));
  };
  level(original, QPen(palette::kGrey, 1.5, Qt::DashLine));
  level(full, QPen(kRecovered, 1.5, Qt::DashLine));
  level(threshold, QPen(palette::kVermillion, 1.5, Qt::DotLine));
  const double radius = std::clamp(r.width() / n / 3, 2.0, 5.0);
  for (size_t i = 0; i < replay_list.size(); ++i) {
    const Replay& x = replay_list[i];
    if (std::isnan(x.logprob)) continue;
    p.setPen(QPen(x.recovered ? kRecovered : palette::kGrey, 1.5));
    p.setBrush(x.recovered ? QBrush(kRecovered) : Qt::NoBrush);
    p.drawEllipse(QPointF(mx(double(i)), my(x.logprob)), radius, radius);
  }
  p.setBrush(Qt::NoBrush);
  plot::axes(p, r, -0.5, n - 0.5, lo - pad, hi + pad, "replay, in the order the search ran it",
             "answer log p");
}

bool CausalFigure::cell_at(const QRectF& area, const QPointF& pt, int64_t* layer,
                           int64_t* kv_head) const {
  if (folder.isEmpty()) return false;
  const Layout l = layout(area);
  if (!l.grid.contains(pt)) return false;
  *kv_head = std::min<int64_t>(kv_heads - 1, int64_t((pt.x() - l.grid.left()) / l.cw));
  *layer = std::min<int64_t>(layers - 1, int64_t((pt.y() - l.grid.top()) / l.ch));
  return true;
}

std::string CausalFigure::trace_of(int64_t layer, int64_t kv_head) const {
  const Cell& c = cells[size_t(layer * kv_heads + kv_head)];
  return c.trace.empty() ? std::string()
                         : QDir(folder).filePath(QString::fromStdString(c.trace)).toStdString();
}

QString CausalFigure::describe(int64_t layer, int64_t kv_head) const {
  const Cell& c = cells[size_t(layer * kv_heads + kv_head)];
  QString s = QString("layer %1 kv head %2").arg(layer).arg(kv_head);
  if (c.minimal) s += " · in the minimal set";
  if (c.measured == Measured::None) return s + " · not restored alone";
  return s + QString(
                 " · %1 restored alone: log p %2 (policy %3, every loss restored %4); click to "
                 "compare")
                 .arg(c.measured == Measured::Head ? "the head" : "its layer")
                 .arg(c.logprob, 0, 'f', 2)
                 .arg(original, 0, 'f', 2)
                 .arg(full, 0, 'f', 2);
}

void CausalFigure::write_csv(QTextStream& out) const {
  out << "layer,kv_head,measured,restore_logprob,share_recovered,in_minimal_set,trace\n";
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t k = 0; k < kv_heads; ++k) {
      const Cell& c = cells[size_t(layer * kv_heads + k)];
      const double s = share(c);
      out << layer << "," << k << ","
          << (c.measured == Measured::Head    ? "head"
              : c.measured == Measured::Layer ? "layer"
                                              : "none")
          << "," << (c.measured == Measured::None ? QString() : QString::number(c.logprob, 'g', 8))
          << "," << (std::isnan(s) ? QString() : QString::number(s, 'g', 6)) << ","
          << (c.minimal ? 1 : 0) << "," << QString::fromStdString(c.trace) << "\n";
    }
}

}  // namespace kvscope::views
