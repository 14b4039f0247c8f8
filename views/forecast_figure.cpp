#include "views/forecast_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <map>
#include <utility>

namespace kvscope::views {

namespace {

constexpr int64_t kSampleBlock = int64_t(1) << 18;  // samples read per hyperslab
const QColor kGateColor = Qt::black;
const QColor kReceivedColor = palette::kPurple.darker(135);

// The token's samples of `gate` at (layer, kv head), in step order: one
// bounded pass over the gate's samples table (no per-token index).
std::vector<std::pair<int32_t, float>> token_samples(const trace::TraceReader& r, int gate,
                                                     int layer, int kv_head, int64_t token) {
  std::vector<std::pair<int32_t, float>> out;
  const int64_t n = r.gate_sample_count(gate);
  for (int64_t a = 0; a < n; a += kSampleBlock) {
    std::vector<int32_t> steps;
    std::vector<trace::GateValue> rows =
        r.gate_samples(gate, a, std::min(n, a + kSampleBlock), &steps);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].token == token && rows[i].layer == layer && rows[i].kv_head == kv_head)
        out.push_back({steps[i], rows[i].value});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

// Where the token was at the head, step by step: tier intervals for tiered
// traces, admission to eviction otherwise; evicted to the end after.
std::vector<ForecastFigure::Band> token_bands(const trace::TraceReader& r, int layer, int kv_head,
                                              int64_t token, int64_t n_steps) {
  std::vector<ForecastFigure::Band> out;
  trace::HeadLifetimes lt = r.lifetimes(layer, kv_head, token, token + 1);
  if (lt.admit_step.empty() || lt.admit_step[0] < 0) return out;
  const int32_t admit = lt.admit_step[0], evict = lt.evict_step[0];
  const int32_t gone = evict < 0 ? int32_t(n_steps) : evict;
  if (r.n_tiers() > 1) {
    for (const trace::TierInterval& iv : r.intervals(layer, kv_head))
      if (iv.token == token)
        out.push_back({iv.begin_step, iv.end_step < 0 ? gone : iv.end_step, int(iv.tier)});
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.begin < b.begin; });
  }
  if (out.empty()) out.push_back({admit, gone, 0});
  if (evict >= 0) out.push_back({evict, int32_t(n_steps), -1});
  return out;
}

void load_marks(ForecastFigure& f, const trace::TraceReader& r) {
  f.promotions = head_events(r, f.layer, f.kv_head, trace::EventKind::Promote, f.token);
  f.stalls = head_stalls(r, f.layer, f.kv_head, f.token);
  std::map<uint16_t, uint8_t> cls;
  for (const trace::Event& e : f.promotions) cls[e.reason] = 0;
  std::vector<uint16_t> reasons;
  for (auto& entry : cls) {
    entry.second = uint8_t(reasons.size());
    reasons.push_back(entry.first);
  }
  f.mark_kinds = mark_classes(reasons, r.run().reason_names);
  const uint8_t stall = uint8_t(f.mark_kinds.size() - 1);
  for (const trace::Event& e : f.promotions) f.marks.push_back({e.step, cls[e.reason]});
  for (const trace::StallRow& s : f.stalls) f.marks.push_back({s.step, stall});
  for (const ForecastFigure::Mark& m : f.marks) ++f.mark_kinds[m.cls].count;
  std::stable_sort(f.marks.begin(), f.marks.end(),
                   [](const auto& a, const auto& b) { return a.step < b.step; });
}

void fit_ranges(ForecastFigure& f) {
  float lo = INFINITY, hi = -INFINITY;
  for (const auto& s : f.samples) lo = std::min(lo, s.second), hi = std::max(hi, s.second);
  if (std::isfinite(f.threshold))
    lo = std::min(lo, float(f.threshold)), hi = std::max(hi, float(f.threshold));
  // Probabilities keep their whole [0, 1] range: 0.6 then reads as 0.6.
  if (!std::isfinite(lo) || (lo >= 0 && hi <= 1)) lo = 0, hi = 1;
  float pad = hi > lo ? (hi - lo) * 0.04f : 0.5f;
  f.gate_lo = lo - pad;
  f.gate_hi = hi + pad;
  float rmax = 0;
  for (float v : f.received)
    if (std::isfinite(v)) rmax = std::max(rmax, v);
  f.received_hi = rmax > 0 ? rmax * 1.08f : 1.f;
}

}  // namespace

std::shared_ptr<ForecastFigure> ForecastFigure::load(TraceData& data, const Selection& sel,
                                                     int gate) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<ForecastFigure>();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->n_steps = r.n_steps();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
  for (size_t g = 0; g < r.layout().gates.size(); ++g)
    if (r.layout().gates[g].time_varying) {
      f->gate_choices.push_back(int(g));
      f->gate_choice_names << QString::fromStdString(r.layout().gates[g].name);
    }
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
  f->tier_attended = r.tier_attended();
  f->tier_attended.resize(f->tier_names.size(), 1);
  // A choice from another trace (the GUI keeps it) falls back to the first.
  if (std::find(f->gate_choices.begin(), f->gate_choices.end(), gate) == f->gate_choices.end())
    gate = f->gate_choices.empty() ? -1 : f->gate_choices.front();
  f->gate = gate;
  if (gate >= 0) {
    const trace::GateSpec& spec = r.layout().gates[size_t(gate)];
    f->gate_name = QString::fromStdString(spec.name);
    f->gate_meaning = QString::fromStdString(spec.meaning);
    f->gate_units = QString::fromStdString(spec.units);
    f->threshold = spec.threshold;
  }
  const TraceBasics& b = data.basics();
  if (gate < 0 || sel.token() < 0 || sel.token() >= b.n_tokens || f->n_steps == 0) return f;
  f->token = sel.token();
  const trace::TokenRecord& tr = b.tokens[size_t(f->token)];
  f->token_text = QString::fromUtf8(tr.text.data(), int(tr.text.size()));
  f->fed_step = tr.step;
  f->samples = token_samples(r, gate, f->layer, f->kv_head, f->token);
  f->has_received = r.layout().received;
  f->received.assign(size_t(f->n_steps), NAN);
  if (f->has_received)
    for (int64_t s = f->fed_step; s < f->n_steps; ++s) {
      trace::ReceivedRow row = r.received(s, f->layer, f->kv_head);
      auto it = std::find(row.tokens.begin(), row.tokens.end(), int32_t(f->token));
      if (it != row.tokens.end())
        f->received[size_t(s)] = row.mass[size_t(it - row.tokens.begin())];
    }
  f->bands = token_bands(r, f->layer, f->kv_head, f->token, f->n_steps);
  load_marks(*f, r);
  fit_ranges(*f);
  return f;
}

QString ForecastFigure::title() const {
  QString what = gate < 0 ? QString("no time-varying gate") : gate_name;
  if (token < 0) return QString("Forecast vs attention · %1").arg(what);
  return QString("Forecast vs attention · %1 · token %2 \"%3\" · layer %4 · kv head %5")
      .arg(what)
      .arg(token)
      .arg(token_text.simplified())
      .arg(layer)
      .arg(kv_head);
}

QString ForecastFigure::fitted_title(const QFontMetricsF& fm, double width) const {
  if (fm.horizontalAdvance(title()) <= width || token < 0) return title();
  QString mid = QString("Forecast vs attention · %1 · token %2 · layer %3 · kv head %4")
                    .arg(gate_name)
                    .arg(token)
                    .arg(layer)
                    .arg(kv_head);
  if (fm.horizontalAdvance(mid) <= width) return mid;
  QString s =
      QString("%1 · token %2 · L%3 kv %4").arg(gate_name).arg(token).arg(layer).arg(kv_head);
  return fm.elidedText(s, Qt::ElideMiddle, width);
}

std::vector<LegendEntry> ForecastFigure::legend_entries(bool compact) const {
  std::vector<LegendEntry> out;
  auto line = [](QPen pen) {
    return [pen](QPainter& p, const QRectF& r) {
      p.setPen(pen);
      p.drawLine(QPointF(r.left(), r.center().y()), QPointF(r.right(), r.center().y()));
    };
  };
  out.push_back({compact ? gate_name : gate_name + " (a sample holds until the next)",
                 line(QPen(kGateColor, 1.8))});
  if (std::isfinite(threshold))
    out.push_back(
        {QString("threshold %1").arg(threshold), line(QPen(QColor(80, 80, 80), 1, Qt::DashLine))});
  if (has_received) out.push_back({"received attention", line(QPen(kReceivedColor, 1.6))});
  std::vector<bool> seen(tier_names.size() + 1, false);
  for (const Band& b : bands)
    seen[b.tier < 0 ? tier_names.size() : std::min(size_t(b.tier), tier_names.size() - 1)] = true;
  for (size_t t = 0; t < tier_names.size(); ++t) {
    if (!seen[t]) continue;
    bool read = t >= tier_attended.size() || tier_attended[t];
    QColor c = palette::tier(int(t));
    c.setAlpha(t == 0 ? 120 : 70);  // hot darker than warm
    if (read)
      out.push_back({"in " + tier_names[t], [c](QPainter& p, const QRectF& r) {
                       p.fillRect(r.adjusted(2, 1, -2, -1), c);
                     }});
    else
      out.push_back(
          {compact ? tier_names[t] + " (not attended)"
                   : "in " + tier_names[t] + " (held, not attended)",
           [](QPainter& p, const QRectF& r) { unattended::fill(p, r.adjusted(2, 1, -2, -1)); }});
  }
  if (seen.back())
    out.push_back({"evicted", [](QPainter& p, const QRectF& r) {
                     p.fillRect(r.adjusted(2, 1, -2, -1), QColor(240, 190, 160));
                   }});
  add_mark_legend(out, mark_kinds, compact);
  out.push_back({QString("step %1").arg(step), line(QPen(QColor(120, 120, 120), 1, Qt::DashLine))});
  return out;
}

ForecastFigure::Layout ForecastFigure::layout(const QRectF& area,
                                              const QPaintDevice* device) const {
  Layout l;
  l.title = QRectF(area.left(), area.top(), area.width(), 30);
  QFontMetricsF fm(plot::font(kLegendPoints), device);
  double row_h = fm.height() + 3, width = std::max(40.0, area.width() - 24);
  int rows = 0;
  if (gate >= 0 && token >= 0) {
    rows = legend_rows(legend_entries(false), fm, width);
    l.compact = rows * row_h > 0.2 * area.height();
    if (l.compact) rows = legend_rows(legend_entries(true), fm, width);
  }
  l.legend = QRectF(area.left() + 12, area.top() + 32, width, rows * row_h);
  // 84 px on the left for the y ticks and labels, 30 on the right for the
  // last step's tick label.
  double left = area.left() + 84, w = std::max(10.0, area.width() - 84 - 30);
  // The lane: stalls in its upper half, promotions in its lower half, so a
  // reactive fetch and its stall at the same step are both seen.
  l.lane = QRectF(left, l.legend.bottom() + (rows > 0 ? 6 : 2), w, 22);
  double top = l.lane.bottom() + 2, gap = 26, bottom = 48;
  double avail = std::max(20.0, area.bottom() - bottom - gap - top);
  l.gate_plot = QRectF(left, top, w, avail * 0.55);
  l.received_plot = QRectF(left, l.gate_plot.bottom() + gap, w, avail - l.gate_plot.height());
  return l;
}

plot::Map ForecastFigure::x_map(const QRectF& plot) const {
  return {-0.5, double(std::max<int64_t>(1, n_steps)) - 0.5, plot.left(), plot.right()};
}

std::vector<QPolygonF> ForecastFigure::gate_line(const QRectF& plot, int columns) const {
  std::vector<QPolygonF> out;
  if (samples.empty()) return out;
  plot::Map mx = x_map(plot), my{gate_lo, gate_hi, plot.bottom(), plot.top()};
  const double end = double(std::max<int64_t>(1, n_steps)) - 0.5;
  QPolygonF run;
  if (int64_t(samples.size()) <= columns) {
    // A step line: each sample holds from its step to the next sample's.
    for (size_t i = 0; i < samples.size(); ++i) {
      double a = samples[i].first - 0.5;
      double b = i + 1 < samples.size() ? samples[i + 1].first - 0.5 : end;
      run << QPointF(mx(a), my(samples[i].second)) << QPointF(mx(b), my(samples[i].second));
    }
    out.push_back(run);
    return out;
  }
  // Folded: the min and max of the values that hold within each pixel column.
  const int cols = std::max(1, columns);
  auto col_of = [&](double x) {
    return std::clamp(int((x + 0.5) / (end + 0.5) * cols), 0, cols - 1);
  };
  std::vector<float> cmin(size_t(cols), INFINITY), cmax(size_t(cols), -INFINITY);
  for (size_t i = 0; i < samples.size(); ++i) {
    double a = samples[i].first - 0.5;
    double b = i + 1 < samples.size() ? samples[i + 1].first - 0.5 : end;
    for (int c = col_of(a), last = col_of(std::max(a, b - 1e-6)); c <= last; ++c) {
      cmin[size_t(c)] = std::min(cmin[size_t(c)], samples[i].second);
      cmax[size_t(c)] = std::max(cmax[size_t(c)], samples[i].second);
    }
  }
  for (int c = 0; c < cols; ++c)
    if (std::isfinite(cmin[size_t(c)])) {
      double x = plot.left() + (c + 0.5) * plot.width() / cols;
      run << QPointF(x, my(cmin[size_t(c)])) << QPointF(x, my(cmax[size_t(c)]));
    }
  out.push_back(run);
  return out;
}

std::vector<QPolygonF> ForecastFigure::received_line(const QRectF& plot, int columns) const {
  std::vector<QPolygonF> out;
  plot::Map mx = x_map(plot), my{0, received_hi, plot.bottom(), plot.top()};
  QPolygonF run;
  const int cols = std::max(1, columns);
  if (int64_t(received.size()) <= cols) {
    for (size_t s = 0; s <= received.size(); ++s) {
      if (s < received.size() && std::isfinite(received[s])) {
        run << QPointF(mx(double(s)), my(received[s]));
      } else if (!run.isEmpty()) {
        out.push_back(std::exchange(run, {}));
      }
    }
    return out;
  }
  const int64_t S = int64_t(received.size());
  std::vector<float> cmin(size_t(cols), INFINITY), cmax(size_t(cols), -INFINITY);
  for (int64_t s = 0; s < S; ++s)
    if (std::isfinite(received[size_t(s)])) {
      size_t c = size_t(std::min<int64_t>(cols - 1, s * cols / S));
      cmin[c] = std::min(cmin[c], received[size_t(s)]);
      cmax[c] = std::max(cmax[c], received[size_t(s)]);
    }
  for (int c = 0; c <= cols; ++c) {
    if (c < cols && std::isfinite(cmin[size_t(c)])) {
      double x = plot.left() + (c + 0.5) * plot.width() / cols;
      run << QPointF(x, my(cmin[size_t(c)])) << QPointF(x, my(cmax[size_t(c)]));
    } else if (!run.isEmpty()) {
      out.push_back(std::exchange(run, {}));
    }
  }
  return out;
}

void ForecastFigure::paint_bands(QPainter& p, const QRectF& plot) const {
  plot::Map mx = x_map(plot);
  p.save();
  p.setClipRect(plot);
  for (const Band& b : bands) {
    QRectF r(QPointF(mx(b.begin - 0.5), plot.top()), QPointF(mx(b.end - 0.5), plot.bottom()));
    if (b.tier < 0) {
      p.fillRect(r, QColor(240, 190, 160, 110));
    } else if (size_t(b.tier) < tier_attended.size() && !tier_attended[size_t(b.tier)]) {
      unattended::fill(p, r);
    } else {
      QColor c = palette::tier(b.tier);
      c.setAlpha(b.tier == 0 ? 120 : 70);
      p.fillRect(r, c);
    }
  }
  p.restore();
}

void ForecastFigure::paint_lane(QPainter& p, const Layout& l) const {
  const QRectF& lane = l.lane;
  plot::Map mx = x_map(lane);
  p.save();
  p.setPen(QColor(200, 200, 200));
  p.drawLine(QPointF(lane.left(), lane.center().y()), QPointF(lane.right(), lane.center().y()));
  p.setFont(plot::font(7));
  p.setPen(QColor(90, 90, 90));
  p.drawText(QRectF(lane.left() - 68, lane.top(), 62, lane.height()),
             Qt::AlignRight | Qt::AlignVCenter, "events");
  // Stalls also as faint lines through both plots, so the eye finds them.
  const double r_promo = 3.5, r_stall = 4.5;
  auto fold = [&](bool stall, double r, auto draw) {
    // At most one mark per class every 2r pixels: many fold into one.
    std::vector<double> last(mark_kinds.size(), -1e9);
    for (const Mark& m : marks) {
      if (mark_kinds[m.cls].stall != stall) continue;
      double x = mx(m.step);
      if (x - last[m.cls] < 2 * r) continue;
      last[m.cls] = x;
      draw(m, x);
    }
  };
  p.setClipRect(l.gate_plot.united(l.received_plot));
  QColor faint = palette::kVermillion;
  faint.setAlpha(90);
  p.setPen(QPen(faint, 1));
  fold(true, 1.0, [&](const Mark&, double x) {
    p.drawLine(QPointF(x, l.gate_plot.top()), QPointF(x, l.received_plot.bottom()));
  });
  p.setClipRect(lane.adjusted(-6, -2, 6, 2));
  fold(false, r_promo, [&](const Mark& m, double x) {
    draw_promotion(p, QPointF(x, lane.bottom() - 5), mark_kinds[m.cls].color, r_promo);
  });
  fold(true, r_stall,
       [&](const Mark&, double x) { draw_stall(p, QPointF(x, lane.top() + 5.5), r_stall); });
  p.restore();
}

QString ForecastFigure::missing_data() const {
  if (gate >= 0 || n_steps == 0) return {};
  return "This trace records no time-varying gate (per-step samples under /gates/NAME/samples), so "
         "there is no forecast to follow. Policies that forecast per step (e.g. sfc: sfc_forecast) "
         "show it here.";
}

void ForecastFigure::paint(QPainter& p, const QRectF& area) const {
  Layout l = layout(area, p.device());
  QFontMetricsF title_fm(plot::font(10, true), p.device());
  plot::title(p, l.title, fitted_title(title_fm, area.width() - 16), gate_meaning);
  QRectF below = area.adjusted(16, 36, -16, -16);
  if (gate < 0) return plot::message(p, below, n_steps == 0 ? "no steps yet" : missing_data());
  if (token < 0)
    return plot::message(p, below,
                         "Select a token (click one in the timeline or the token text, or "
                         "--token T) to see its forecast against the attention it received");
  double scale = std::max(1.0, p.worldTransform().m11());
  paint_bands(p, l.gate_plot);
  if (has_received) paint_bands(p, l.received_plot);
  paint_lane(p, l);
  p.save();
  p.setClipRect(l.gate_plot);
  plot::Map mx = x_map(l.gate_plot);
  plot::Map my{gate_lo, gate_hi, l.gate_plot.bottom(), l.gate_plot.top()};
  if (std::isfinite(threshold)) {
    p.setPen(QPen(QColor(80, 80, 80), 1, Qt::DashLine));
    p.drawLine(QPointF(l.gate_plot.left(), my(threshold)),
               QPointF(l.gate_plot.right(), my(threshold)));
  }
  p.setPen(QPen(kGateColor, 1.8));
  p.setBrush(Qt::NoBrush);
  for (const QPolygonF& run : gate_line(l.gate_plot, int(l.gate_plot.width() * scale)))
    p.drawPolyline(run);
  p.restore();
  if (samples.empty())
    plot::message(p, l.gate_plot,
                  QString("no %1 sample for token %2 at layer %3, kv head %4")
                      .arg(gate_name)
                      .arg(token)
                      .arg(layer)
                      .arg(kv_head));
  // The current step through the lane and both plots.
  p.save();
  p.setPen(QPen(QColor(120, 120, 120), 1, Qt::DashLine));
  double xs = mx(double(step));
  p.drawLine(QPointF(xs, l.lane.top()), QPointF(xs, l.gate_plot.bottom()));
  if (has_received)
    p.drawLine(QPointF(xs, l.received_plot.top()), QPointF(xs, l.received_plot.bottom()));
  p.restore();
  QFontMetricsF label_fm(plot::font(9), p.device());
  // The longer label where it fits along the plot's height, else the brief one.
  auto fit = [&](const QString& full, const QString& brief, double room) {
    if (label_fm.horizontalAdvance(full) <= room) return full;
    return label_fm.elidedText(brief, Qt::ElideRight, room);
  };
  QString units = gate_units.isEmpty() || gate_units == "1" ? QString() : " (" + gate_units + ")";
  plot::axes(p, l.gate_plot, -0.5, double(std::max<int64_t>(1, n_steps)) - 0.5, gate_lo, gate_hi,
             "", fit(gate_name + units, gate_name, l.gate_plot.height() * 0.95));
  if (has_received) {
    p.save();
    p.setClipRect(l.received_plot.adjusted(-2, -2, 2, 2));
    p.setPen(QPen(kReceivedColor, 1.6));
    p.setBrush(kReceivedColor);
    for (const QPolygonF& run :
         received_line(l.received_plot, int(l.received_plot.width() * scale)))
      run.size() == 1 ? p.drawEllipse(run.front(), 1.5, 1.5) : p.drawPolyline(run);
    p.restore();
    plot::axes(p, l.received_plot, -0.5, double(std::max<int64_t>(1, n_steps)) - 0.5, 0,
               received_hi, "step",
               fit("received attention", "received", l.received_plot.height() * 0.95));
  } else {
    p.save();
    p.setPen(QColor(170, 170, 170));
    p.setBrush(Qt::NoBrush);
    p.drawRect(l.received_plot);
    p.restore();
    plot::message(p, l.received_plot.adjusted(8, 4, -8, -4),
                  "no received attention in this trace: capture with --capture received to see "
                  "the attention the token got each step");
  }
  paint_legend_rows(p, l.legend, legend_entries(l.compact));
}

int64_t ForecastFigure::step_at(const QRectF& area, const QPointF& point) const {
  Layout l = layout(area);
  QRectF all = l.lane.united(l.gate_plot).united(l.received_plot);
  if (!all.contains(point) || n_steps == 0) return -1;
  return std::clamp<int64_t>(std::llround(x_map(l.gate_plot).inverse(point.x())), 0, n_steps - 1);
}

void ForecastFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "kind,step,end_step,value,detail\n";
  for (const auto& [s, v] : samples) out << "sample," << s << ",," << v << ',' << gate_name << '\n';
  if (has_received)
    for (int64_t s = fed_step; s < int64_t(received.size()); ++s) {
      float v = received[size_t(s)];
      out << "received," << s << ",," << (std::isfinite(v) ? QString::number(v) : QString())
          << ",\n";
    }
  for (const Band& b : bands)
    out << "tier," << b.begin << ',' << b.end << ",,"
        << (b.tier < 0 ? QString("evicted") : tier_names[size_t(b.tier)]) << '\n';
  for (const trace::Event& e : promotions) {
    QString reason;
    for (const MarkClass& k : mark_kinds)
      if (!k.stall && k.reason == e.reason) reason = k.label;
    reason.replace('"', "\"\"");
    out << "promote," << e.step << ",," << e.score << ",\"" << reason << "\"\n";
  }
  for (const trace::StallRow& s : stalls)
    out << "stall," << s.step << ",," << s.wait_s << ",needed=" << int(s.needed) << '\n';
}

}  // namespace kvscope::views
