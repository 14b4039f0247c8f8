#include "views/tokens_figure.h"

#include "views/legend.h"
#include "views/task_marks.h"

#include <QFontMetricsF>
#include <algorithm>
#include <cmath>

#include "core/analysis/lifetimes.h"

namespace kvscope::views {

namespace {

// Token history: the colours of evicted and never-admitted spans of a head's row.
const QColor kHistoryEvicted{240, 190, 160}, kHistoryRejected{110, 110, 110};
constexpr double kMinLine = 18, kPad = 8;
QFont token_font() {
  return plot::font(9);
}

// Needle tokens bold, generated ones italic: laid out in the font they are
// drawn in, or a bold needle overruns its box into the next token.
QFont token_font(uint8_t role) {
  QFont f = token_font();
  f.setItalic(role == uint8_t(trace::TokenRole::Generated));
  f.setBold(role == uint8_t(trace::TokenRole::Needle));
  return f;
}

QColor role_underline(uint8_t role) {
  if (role == uint8_t(trace::TokenRole::Needle)) return kNeedleColor;
  if (role == uint8_t(trace::TokenRole::Question)) return kQuestionColor;
  return {};
}

QString display(const QString& s) {
  QString out = s;
  out.replace('\n', QString::fromUtf8("⏎"));
  out.replace('\t', ' ');
  return out.isEmpty() ? QString::fromUtf8("∅") : out;
}
}  // namespace

std::shared_ptr<TokensFigure> TokensFigure::load(TraceData& data, const Selection& sel,
                                                 TokenColoring coloring) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<TokensFigure>();
  f->coloring = coloring;
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  f->selected = sel.tokens;
  const TraceBasics& b = data.basics();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, b.n_steps - 1));
  for (const trace::TokenRecord& t : b.tokens) {
    f->text.push_back(QString::fromUtf8(t.text.data(), int(t.text.size())));
    f->role.push_back(uint8_t(t.role));
  }
  f->fed_step = b.fed_step;
  const analysis::AllLifetimes& all = data.all_lifetimes();
  int64_t T = all.n_tokens();
  f->held.resize(size_t(f->layers * f->kv_heads * T));
  for (size_t i = 0; i < f->held.size(); ++i)
    f->held[i] = analysis::held_at(all.admit[i], all.evict[i], f->step);
  if (!r.layout().gates.empty()) {
    f->gate_name = QString::fromStdString(r.layout().gates[0].name);
    f->score = r.gate_values(0, f->layer, f->kv_head);
  }
  return f;
}

QString TokensFigure::title() const {
  static const char* modes[] = {"heads holding (all layers)", "heads holding (layer)",
                                "held by the current head", "gate score"};
  return QString("Tokens · step %1 · colour: %2").arg(step).arg(modes[int(coloring)]);
}

double TokensFigure::value(int64_t t) const {
  int64_t T = int64_t(text.size());
  if (t < 0 || t >= T) return NAN;
  if (fed_step[size_t(t)] > step) return NAN;  // not fed yet at this step
  auto count = [&](int64_t l0, int64_t l1, int64_t k0, int64_t k1) {
    int64_t n = 0;
    for (int64_t l = l0; l < l1; ++l)
      for (int64_t k = k0; k < k1; ++k) n += held[size_t((l * kv_heads + k) * T + t)];
    return double(n) / double(std::max<int64_t>(1, (l1 - l0) * (k1 - k0)));
  };
  switch (coloring) {
    case TokenColoring::AllHeads: return count(0, layers, 0, kv_heads);
    case TokenColoring::Layer: return count(layer, layer + 1, 0, kv_heads);
    case TokenColoring::Head: return count(layer, layer + 1, kv_head, kv_head + 1);
    case TokenColoring::Score: {
      if (score.empty()) return NAN;
      float lo = INFINITY, hi = -INFINITY;
      for (float v : score)
        if (v == v) lo = std::min(lo, v), hi = std::max(hi, v);
      float v = score[size_t(t)];
      return v == v && hi > lo ? double((v - lo) / (hi - lo)) : NAN;
    }
  }
  return NAN;
}

void TokensFigure::layout(double width, QPaintDevice* device) const {
  // Text is measured on the device it is drawn on: an export at 300 dpi
  // renders the same point size larger than the screen does, and boxes
  // measured on the screen would make the glyphs overprint each other.
  const int dpi = device ? device->logicalDpiY() : 0;
  if (width == layout_width_ && dpi == layout_dpi_) return;
  layout_width_ = width;
  layout_dpi_ = dpi;
  QFontMetricsF fm(token_font(), device);
  QFontMetricsF bold(token_font(uint8_t(trace::TokenRole::Needle)), device);
  QFontMetricsF italic(token_font(uint8_t(trace::TokenRole::Generated)), device);
  const double line = std::max(kMinLine, std::ceil(fm.height()) + 4);
  boxes_.resize(text.size());
  double x = kPad, y = kPad;
  for (size_t t = 0; t < text.size(); ++t) {
    QString s = display(text[t]);
    const QFontMetricsF& m = role[t] == uint8_t(trace::TokenRole::Needle)      ? bold
                             : role[t] == uint8_t(trace::TokenRole::Generated) ? italic
                                                                               : fm;
    double w = m.horizontalAdvance(s) + 2;
    if (x + w > width - kPad && x > kPad) {
      x = kPad;
      y += line;
    }
    boxes_[t] = QRectF(x, y, w, line - 2);
    x += w;
    if (text[t].contains('\n')) {  // honour line breaks of the text
      x = kPad;
      y += line;
    }
  }
  height_ = y + line + kPad;
}

std::vector<LegendEntry> TokensFigure::key() const {
  std::vector<LegendEntry> out;
  auto has = [&](trace::TokenRole r) {
    return std::find(role.begin(), role.end(), uint8_t(r)) != role.end();
  };
  if (has(trace::TokenRole::Needle))
    out.push_back(legend_box("needle (bold, underlined)", kNeedleColor));
  if (has(trace::TokenRole::Question))
    out.push_back(legend_box("question (underlined)", kQuestionColor));
  if (has(trace::TokenRole::Generated))
    out.push_back({"generated (italic)", [](QPainter& p, const QRectF& r) {
                     QFont f = token_font(uint8_t(trace::TokenRole::Generated));
                     p.setFont(f);
                     p.setPen(Qt::black);
                     p.drawText(r, Qt::AlignCenter, "ab");
                   }});
  return out;
}

QRectF TokensFigure::body(const QRectF& area) const {
  std::vector<LegendEntry> styles = key();
  double h = styles.empty() ? 0 : legend_height(styles, area.width() - 16) + 4;
  return area.adjusted(0, 34 + h, 0, 0);
}

double TokensFigure::content_height(double width) const {
  layout(width, nullptr);
  return height_;
}

int64_t TokensFigure::token_at(const QRectF& area, const QPointF& point) const {
  QRectF body = this->body(area);
  layout(body.width(), nullptr);
  QPointF c(point.x() - body.left(), point.y() - body.top() + scroll);
  auto it = std::lower_bound(boxes_.begin(), boxes_.end(), c.y(),
                             [](const QRectF& b, double y) { return b.bottom() < y; });
  for (; it != boxes_.end() && it->top() <= c.y(); ++it)
    if (it->contains(c)) return int64_t(it - boxes_.begin());
  return -1;
}

QString TokensFigure::tooltip(int64_t t) const {
  int64_t T = int64_t(text.size());
  if (t < 0 || t >= T) return {};
  static const char* roles[] = {"prompt", "generated", "needle", "template", "question"};
  QString s = QString("token %1 \"%2\" (%3, fed at step %4)\n")
                  .arg(t)
                  .arg(display(text[size_t(t)]))
                  .arg(roles[std::min<int>(role[size_t(t)], 4)])
                  .arg(fed_step[size_t(t)]);
  // Per-head status at the step: one line per layer, one mark per kv head.
  int64_t shown = std::min<int64_t>(layers, 48);
  for (int64_t l = 0; l < shown; ++l) {
    QString marks;
    int n = 0;
    for (int64_t k = 0; k < kv_heads; ++k) {
      bool h = held[size_t((l * kv_heads + k) * T + t)];
      n += h;
      marks += h ? QString::fromUtf8("●") : QString::fromUtf8("·");
    }
    s += QString("layer %1: %2 %3/%4\n").arg(l, 2).arg(marks).arg(n).arg(kv_heads);
  }
  if (shown < layers) s += QString("… %1 more layers\n").arg(layers - shown);
  if (!score.empty())
    s += QString("%1 at current head: %2").arg(gate_name).arg(double(score[size_t(t)]));
  return s.trimmed();
}

void TokensFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(),
              coloring == TokenColoring::Score ? gate_name : QString());
  QRectF body = this->body(area);
  std::vector<LegendEntry> styles = key();
  if (!styles.empty())
    paint_legend_rows(
        p,
        QRectF(area.left() + 8, area.top() + 32, area.width() - 16, body.top() - area.top() - 34),
        styles);
  layout(body.width(), p.device());
  ColorScale cs;
  cs.map = ColorMapId::Viridis;
  p.save();
  p.setClipRect(body);
  auto first = std::lower_bound(boxes_.begin(), boxes_.end(), scroll,
                                [](const QRectF& b, double y) { return b.top() < y - 0.5; });
  // Whole lines only: a line cut by the bottom edge waits for the scroll.
  for (auto it = first; it != boxes_.end() && it->bottom() <= scroll + body.height() + 0.5; ++it) {
    int64_t t = int64_t(it - boxes_.begin());
    QRectF box = it->translated(body.left(), body.top() - scroll);
    double v = value(t);
    QColor bg = std::isnan(v) ? QColor(240, 240, 240) : QColor(cs.color(float(v)));
    p.fillRect(box, bg);
    bool dark = !std::isnan(v) && v < 0.55;
    p.setPen(dark ? Qt::white : Qt::black);
    p.setFont(token_font(role[size_t(t)]));
    p.drawText(box, Qt::AlignCenter, display(text[size_t(t)]));
    if (QColor u = role_underline(role[size_t(t)]); u.isValid())
      p.fillRect(QRectF(box.left(), box.bottom() - 2.5, box.width(), 2.5), u);
    if (std::binary_search(selected.begin(), selected.end(), t)) {
      p.setPen(QPen(palette::kVermillion, 2));
      p.setBrush(Qt::NoBrush);
      p.drawRect(box.adjusted(0.5, 0.5, -0.5, -0.5));
    }
  }
  p.restore();
}

void TokensFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "token,text,role,fed_step,value\n";
  for (size_t t = 0; t < text.size(); ++t) {
    QString s = text[t];
    s.replace('"', "\"\"");
    double v = value(int64_t(t));
    out << t << ",\"" << s << "\"," << int(role[t]) << ',' << fed_step[t] << ','
        << (std::isnan(v) ? QString() : QString::number(v)) << '\n';
  }
}

std::shared_ptr<TokenHistoryFigure> TokenHistoryFigure::load(TraceData& data,
                                                             const Selection& sel) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<TokenHistoryFigure>();
  f->layers = r.n_layers();
  f->kv_heads = r.n_kv_heads();
  f->n_steps = r.n_steps();
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  f->step = sel.step;
  f->token = sel.token();
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
  const TraceBasics& b = data.basics();
  if (f->token < 0 || f->token >= b.n_tokens) return f;
  const trace::TokenRecord& tr = b.tokens[size_t(f->token)];
  f->token_text = QString::fromUtf8(tr.text.data(), int(tr.text.size()));
  f->fed_step = tr.step;
  const analysis::AllLifetimes& all = data.all_lifetimes();
  for (int64_t l = 0; l < f->layers; ++l)
    for (int64_t k = 0; k < f->kv_heads; ++k) {
      size_t i = all.index(l, k, f->token);
      f->admit.push_back(all.admit[i]);
      f->evict.push_back(all.evict[i]);
    }
  if (r.n_tiers() > 1) {
    for (int64_t l = 0; l < f->layers; ++l)
      for (int64_t k = 0; k < f->kv_heads; ++k) {
        std::vector<trace::TierInterval> mine;
        for (const trace::TierInterval& iv : r.intervals(int(l), int(k)))
          if (iv.token == f->token) mine.push_back(iv);
        f->tiers.push_back(std::move(mine));
      }
  }
  if (!r.layout().gates.empty()) {
    f->gate_name = QString::fromStdString(r.layout().gates[0].name);
    for (int64_t l = 0; l < f->layers; ++l)
      for (int64_t k = 0; k < f->kv_heads; ++k)
        f->gate_value.push_back(r.gate_values(0, int(l), int(k), f->token, f->token + 1)[0]);
  }
  // Score over time: the first time-varying gate's samples of this token at
  // the current head (a bounded scan of the samples table).
  for (size_t g = 0; g < r.layout().gates.size(); ++g) {
    if (!r.layout().gates[g].time_varying) continue;
    f->sample_gate = QString::fromStdString(r.layout().gates[g].name);
    int64_t n = r.gate_sample_count(int(g));
    const int64_t block = 1 << 18;
    for (int64_t a = 0; a < n && a < (int64_t(1) << 26); a += block) {
      std::vector<int32_t> steps;
      std::vector<trace::GateValue> rows =
          r.gate_samples(int(g), a, std::min(n, a + block), &steps);
      for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i].token == f->token && rows[i].layer == f->layer && rows[i].kv_head == f->kv_head)
          f->samples.push_back({steps[i], rows[i].value});
    }
    break;
  }
  return f;
}

QString TokenHistoryFigure::title() const {
  if (token < 0) return "Token history";
  return QString("Token history · token %1 \"%2\"").arg(token).arg(display(token_text));
}

void TokenHistoryFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title(),
              token >= 0 ? QString("fed at step %1").arg(fed_step) : QString());
  if (token < 0)
    return plot::message(p, area.adjusted(70, 40, -24, -50),
                         "click a token (token text view) to see its history");
  // The key flows above the plot: the tiers it was held in, evicted, never
  // admitted, the current head's outline and the step line.
  std::vector<LegendEntry> key;
  const int64_t rows = layers * kv_heads;
  std::vector<uint8_t> tier_used(std::max<size_t>(1, tier_names.size()), 0);
  bool any_evicted = false, any_rejected = false;
  for (int64_t i = 0; i < rows; ++i) {
    any_rejected |= admit[size_t(i)] < 0;
    any_evicted |= evict[size_t(i)] >= 0;
    if (admit[size_t(i)] >= 0 && (tiers.empty() || tiers[size_t(i)].empty())) tier_used[0] = 1;
    if (!tiers.empty())
      for (const trace::TierInterval& iv : tiers[size_t(i)])
        if (iv.tier < tier_used.size()) tier_used[iv.tier] = 1;
  }
  for (size_t t = 0; t < tier_used.size(); ++t)
    if (tier_used[t])
      key.push_back(legend_box(t < tier_names.size() ? "held: " + tier_names[t] : QString("held"),
                               palette::tier(int(t))));
  if (any_evicted) key.push_back(legend_box("evicted", kHistoryEvicted));
  if (any_rejected) key.push_back(legend_box("never admitted", kHistoryRejected));
  key.push_back({"current head", [](QPainter& q, const QRectF& r) {
                   q.setPen(QPen(Qt::black, 1.5));
                   q.setBrush(Qt::NoBrush);
                   q.drawRect(r.adjusted(2, 2, -2, -2));
                 }});
  key.push_back(legend_line(QString("step %1").arg(step), QPen(palette::kVermillion, 1.5)));
  const double key_h = legend_height(key, area.width() - 24);
  paint_legend_rows(p, QRectF(area.left() + 12, area.top() + 32, area.width() - 24, key_h), key);
  QRectF inner = area.adjusted(70, 40 + key_h, -24, -50);
  bool with_samples = !samples.empty();
  // The gate strip keeps at least 44 px: two tick labels apart.
  double strip_h = with_samples ? std::max(44.0, inner.height() * 0.32 - 30) : 0;
  QRectF bars(inner.left(), inner.top(), inner.width(),
              with_samples ? inner.height() - strip_h - 30 : inner.height());
  plot::Map mx{0, double(std::max<int64_t>(1, n_steps)), bars.left(), bars.right()};
  double rh = bars.height() / std::max<int64_t>(1, rows);
  p.save();
  p.setClipRect(bars);
  for (int64_t i = 0; i < rows; ++i) {
    double y = bars.top() + i * rh;
    int32_t a = admit[size_t(i)], e = evict[size_t(i)];
    if (a < 0) {
      p.fillRect(QRectF(mx(fed_step), y, bars.right() - mx(fed_step), std::max(rh - 0.5, 0.5)),
                 kHistoryRejected);
      continue;
    }
    double end = e < 0 ? double(n_steps) : double(e);
    if (!tiers.empty() && !tiers[size_t(i)].empty()) {
      for (const trace::TierInterval& iv : tiers[size_t(i)]) {
        double ie = iv.end_step < 0 ? end : double(iv.end_step);
        p.fillRect(
            QRectF(QPointF(mx(iv.begin_step), y), QPointF(mx(ie), y + std::max(rh - 0.5, 0.5))),
            palette::tier(iv.tier));
      }
    } else {
      p.fillRect(QRectF(QPointF(mx(a), y), QPointF(mx(end), y + std::max(rh - 0.5, 0.5))),
                 palette::tier(0));
    }
    if (e >= 0)
      p.fillRect(QRectF(QPointF(mx(e), y), QPointF(bars.right(), y + std::max(rh - 0.5, 0.5))),
                 kHistoryEvicted);
  }
  int64_t cur = int64_t(layer) * kv_heads + kv_head;
  p.setPen(QPen(Qt::black, 1.5));
  p.setBrush(Qt::NoBrush);
  p.drawRect(QRectF(bars.left(), bars.top() + cur * rh, bars.width(), rh));
  p.setPen(QPen(palette::kVermillion, 1.5));
  p.drawLine(QPointF(mx(step + 0.5), bars.top()), QPointF(mx(step + 0.5), bars.bottom()));
  p.restore();
  // The long label where it fits along the rows, else "layer".
  QString ylabel = "layer (kv heads within)";
  if (QFontMetricsF(plot::font(9)).horizontalAdvance(ylabel) > bars.height()) ylabel = "layer";
  plot::axes(p, bars, 0, double(n_steps), 0, double(layers), with_samples ? "" : "step", ylabel,
             true);
  if (with_samples) {
    QRectF sr(inner.left(), bars.bottom() + 30, inner.width(), strip_h);
    float lo = INFINITY, hi = -INFINITY;
    for (auto [s, v] : samples) lo = std::min(lo, v), hi = std::max(hi, v);
    if (hi <= lo) lo -= 0.5f, hi += 0.5f;  // one value: centre it
    plot::Map my{lo, hi, sr.bottom(), sr.top()};
    QPolygonF line;
    for (auto [s, v] : samples) line << QPointF(mx(s + 0.5), my(v));
    p.setPen(QPen(palette::kOrange, 2));
    p.drawPolyline(line);
    for (const QPointF& pt : line) p.drawEllipse(pt, 2, 2);
    // The series is named in full under the strip, whose height is too short
    // for the name along it (it ran up into the rows' axis title).
    const QString along =
        QFontMetricsF(plot::font(9)).elidedText(sample_gate, Qt::ElideMiddle, sr.height());
    plot::axes(p, sr, 0, double(n_steps), lo, hi, "step · line: " + sample_gate, along);
  }
}

void TokenHistoryFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "layer,kv_head,admit_step,evict_step,tier_moves,"
      << (gate_name.isEmpty() ? "gate" : gate_name) << "\n";
  for (int64_t l = 0; l < layers && token >= 0; ++l)
    for (int64_t k = 0; k < kv_heads; ++k) {
      size_t i = size_t(l * kv_heads + k);
      out << l << ',' << k << ',' << admit[i] << ',' << evict[i] << ",\"";
      if (!tiers.empty())
        for (const trace::TierInterval& iv : tiers[i])
          out << int(iv.tier) << ':' << iv.begin_step << '-' << iv.end_step << ';';
      out << "\"," << (gate_value.empty() ? QString() : QString::number(gate_value[i])) << '\n';
    }
  for (auto [s, v] : samples) out << "# sample," << s << ',' << v << '\n';
}

}  // namespace kvscope::views
