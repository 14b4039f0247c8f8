#include "views/timeline_figure.h"

#include <QFontMetricsF>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace kvscope::views {

QColor timeline_class_color(const analysis::TimelineClasses& classes, int c,
                            const std::vector<uint8_t>& attended) {
  if (c < classes.tiers) {
    bool read = size_t(c) >= attended.size() || attended[size_t(c)] != 0;
    return read ? palette::tier(c) : unattended::kFill;
  }
  if (c == classes.evicted()) return QColor(240, 190, 160);  // light vermillion
  return QColor(110, 110, 110);                              // rejected
}

namespace {

// Room for token labels: rows left of the plot, columns (rotated) below it.
constexpr double kTokenLabelRoom = 52;

// The head's promotions, merges and stalls as marks, by step; a class per
// promotion reason, then entries that absorbed a merged value (at the step,
// on the absorbing token), stalls last.
void load_marks(TimelineFigure& f, const trace::TraceReader& r) {
  f.promotions = head_events(r, f.layer, f.kv_head, trace::EventKind::Promote);
  f.stalls = head_stalls(r, f.layer, f.kv_head);
  for (const trace::MergeRow& m : r.merges())
    if (m.layer == f.layer && m.kv_head == f.kv_head) f.merges.push_back(m);
  std::map<uint16_t, uint8_t> cls;
  for (const trace::Event& e : f.promotions) cls[e.reason] = 0;
  std::vector<uint16_t> reasons;
  for (auto& entry : cls) {
    entry.second = uint8_t(reasons.size());
    reasons.push_back(entry.first);
  }
  f.mark_kinds = mark_classes(reasons, r.run().reason_names);
  if (!f.merges.empty()) f.mark_kinds.insert(f.mark_kinds.end() - 1, merge_class());
  const uint8_t stall = uint8_t(f.mark_kinds.size() - 1);
  for (const trace::Event& e : f.promotions) f.marks.push_back({e.step, e.token, cls[e.reason]});
  std::set<std::pair<int32_t, int32_t>> absorbed;  // one mark per (step, absorbing token)
  for (const trace::MergeRow& m : f.merges)
    if (absorbed.insert({m.step, m.into}).second)
      f.marks.push_back({m.step, m.into, uint8_t(stall - 1)});
  for (const trace::StallRow& s : f.stalls) f.marks.push_back({s.step, s.token, stall});
  for (const TimelineFigure::Mark& m : f.marks) ++f.mark_kinds[m.cls].count;
  std::stable_sort(f.marks.begin(), f.marks.end(),
                   [](const auto& a, const auto& b) { return a.step < b.step; });
}

}  // namespace

std::shared_ptr<TimelineFigure> TimelineFigure::load(TraceData& data, const Selection& sel,
                                                     TimelineMode mode) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<TimelineFigure>();
  f->mode = mode;
  f->layer = sel.layer;
  f->kv_head = sel.kv_head();
  const TraceBasics& b = data.basics();
  f->n_steps = b.n_steps;
  f->n_tokens = b.n_tokens;
  f->spans = task_spans(b.tokens);
  f->reconstruction = reconstruction_steps(b.steps);
  f->n_layers = r.n_layers();
  f->n_kv_heads = r.n_kv_heads();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, b.n_steps - 1));
  f->selected_token = sel.token();
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
  f->tier_attended = r.tier_attended();
  f->tier_attended.resize(f->tier_names.size(), 1);
  auto texts = std::make_shared<std::vector<QString>>();
  for (const trace::TokenRecord& t : b.tokens)
    texts->push_back(QString::fromUtf8(t.text.data(), int(t.text.size())));
  f->token_text = texts;
  if (mode == TimelineMode::Head) {
    f->head = std::make_shared<analysis::HeadTimeline>(
        analysis::HeadTimeline::read(r, f->layer, f->kv_head));
    for (int32_t e : f->head->lifetimes.evict_step) f->any_evicted |= e >= 0;
    for (int32_t a : f->head->lifetimes.admit_step) f->any_rejected |= a < 0;
    load_marks(*f, r);
  } else {
    f->counts = analysis::layer_head_counts(data.all_lifetimes(), f->step);
    f->fed_step = b.fed_step;
  }
  f->viewport_ = f->extent();
  return f;
}

QRectF TimelineFigure::extent() const {
  if (mode == TimelineMode::Head)
    return QRectF(0, 0, double(std::max<int64_t>(1, n_steps)),
                  double(std::max<int64_t>(1, n_tokens)));
  return QRectF(0, 0, double(std::max<int64_t>(1, n_tokens)),
                double(std::max<int64_t>(1, n_layers)));
}

void TimelineFigure::set_viewport(const QRectF& v) {
  QRectF e = extent();
  double w = std::clamp(v.width(), std::min(1.0, e.width()), e.width());
  double h = std::clamp(v.height(), std::min(1.0, e.height()), e.height());
  if (mode == TimelineMode::Layers) h = e.height();  // all layers, always
  viewport_ = QRectF(std::clamp(v.left(), e.left(), e.right() - w),
                     std::clamp(v.top(), e.top(), e.bottom() - h), w, h);
}

TimelineFigure::Layout TimelineFigure::layout(const QRectF& area,
                                              const QPaintDevice* device) const {
  Layout l;
  if (mode == TimelineMode::Layers) {
    // Columns of 9 px or more are labelled with their tokens: a deeper margin.
    plot::Frame fr = plot::frame(area, true, 70, 48);
    const plot::Frame labelled = plot::frame(area, true, 70, kTokenLabelRoom + 30);
    l.token_columns = token_text && labelled.plot.width() / viewport_.width() >= 9;
    if (l.token_columns) fr = labelled;
    l.title = fr.title;
    l.plot = fr.plot;
    l.colorbar = fr.colorbar;
    return l;
  }
  // Head mode: the legend flows in rows above the plot, so it never covers
  // data; short labels when the full ones would crowd the plot out.
  l.title = QRectF(area.left(), area.top(), area.width(), 30);
  QFontMetricsF fm(plot::font(kLegendPoints), device);
  double row_h = fm.height() + 3, width = std::max(40.0, area.width() - 24);
  int rows = legend_rows(legend_entries(false), fm, width);
  l.compact = rows * row_h > 0.2 * area.height();
  if (l.compact) rows = legend_rows(legend_entries(true), fm, width);
  l.legend = QRectF(area.left() + 12, area.top() + 32, width, rows * row_h);
  double top = l.legend.bottom() + 8;
  // 24 px on the right: the last step's tick label is centred on the edge.
  // Rows of 9 px or more are labelled with their tokens: a wider margin.
  auto plot_at = [&](double left) {
    return QRectF(area.left() + left, top, std::max(10.0, area.width() - left - 24),
                  std::max(10.0, area.bottom() - top - 48));
  };
  l.plot = plot_at(70);
  l.token_rows = token_text && l.plot.height() / viewport_.height() >= 9;
  if (l.token_rows) l.plot = plot_at(kTokenLabelRoom + 30);
  return l;
}

QPointF TimelineFigure::cell_center(const QRectF& plot, double s, double t) const {
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  plot::Map my{viewport_.top(), viewport_.bottom(), plot.top(), plot.bottom()};
  return QPointF(mx(s + 0.5), my(t + 0.5));
}

std::vector<std::vector<QPointF>> TimelineFigure::mark_positions(const QRectF& plot,
                                                                 double bucket) const {
  std::vector<std::vector<QPointF>> out(mark_kinds.size());
  const double b = std::max(1.0, bucket);
  const int nx = int(plot.width() / b) + 1, ny = int(plot.height() / b) + 1;
  std::vector<std::vector<uint8_t>> used(mark_kinds.size());
  // Only the steps in view (marks are in step order), then one mark per
  // bucket and class: the work is the marks in view plus the buckets.
  auto first = std::lower_bound(marks.begin(), marks.end(), int32_t(std::floor(viewport_.left())),
                                [](const Mark& m, int32_t s) { return m.step < s; });
  for (auto it = first; it != marks.end() && it->step < viewport_.right(); ++it) {
    if (it->token + 1 <= viewport_.top() || it->token >= viewport_.bottom()) continue;
    QPointF c = cell_center(plot, it->step, it->token);
    if (!plot.contains(c)) continue;
    int bx = std::min(nx - 1, int((c.x() - plot.left()) / b));
    int by = std::min(ny - 1, int((c.y() - plot.top()) / b));
    std::vector<uint8_t>& u = used[it->cls];
    if (u.empty()) u.assign(size_t(nx) * size_t(ny), 0);
    uint8_t& cell = u[size_t(by) * size_t(nx) + size_t(bx)];
    if (cell) continue;
    cell = 1;
    out[it->cls].push_back(c);
  }
  return out;
}

QString TimelineFigure::title() const {
  bool tiered = std::find(tier_attended.begin(), tier_attended.end(), 0) != tier_attended.end();
  if (mode == TimelineMode::Head)
    return QString("%1 timeline · layer %2 · kv head %3")
        .arg(tiered ? "Tier" : "Eviction")
        .arg(layer)
        .arg(kv_head);
  return QString("Heads holding each token · step %1").arg(step);
}

QColor TimelineFigure::cell_color(int64_t s, int64_t t) const {
  if (!head) return QColor();
  analysis::TimelineRaster r =
      analysis::fold_timeline(*head, double(s), double(s + 1), double(t), double(t + 1), 1, 1);
  double rr = 255, gg = 255, bb = 255;
  for (int c = 0; c < r.classes.count(); ++c) {
    float w = r.at(0, 0, c);
    QColor k = timeline_class_color(r.classes, c, tier_attended);
    rr += w * (k.red() - 255);
    gg += w * (k.green() - 255);
    bb += w * (k.blue() - 255);
  }
  return QColor(int(std::lround(rr)), int(std::lround(gg)), int(std::lround(bb)));
}

QString TimelineFigure::describe(double x, double y) const {
  const bool head_mode = mode == TimelineMode::Head;
  const int64_t t = int64_t(std::floor(head_mode ? y : x));
  const int64_t row = int64_t(std::floor(head_mode ? x : y));  // step, or layer
  if (t < 0 || t >= n_tokens || row < 0) return {};
  QString text = token_text && t < int64_t(token_text->size()) ? (*token_text)[size_t(t)] : "";
  const QString token = QString("token %1 \"%2\"").arg(t).arg(text.simplified());
  if (!head_mode) {
    if (row >= n_layers || counts.empty()) return {};
    if (t < int64_t(fed_step.size()) && fed_step[size_t(t)] > step)
      return QString("%1 · layer %2: not fed yet at step %3").arg(token).arg(row).arg(step);
    return QString("%1 · layer %2: %3 of %4 kv heads hold it at step %5")
        .arg(token)
        .arg(row)
        .arg(counts[size_t(row * n_tokens + t)])
        .arg(n_kv_heads)
        .arg(step);
  }
  if (!head || row >= n_steps) return {};
  // The cell's state class: the one covering most of it.
  const analysis::TimelineRaster r =
      analysis::fold_timeline(*head, double(row), double(row + 1), double(t), double(t + 1), 1, 1);
  int best = -1;
  float most = 0;
  for (int c = 0; c < r.classes.count(); ++c)
    if (r.at(0, 0, c) > most) most = r.at(0, 0, c), best = c;
  QString state = "not fed yet";
  if (best >= 0 && best < r.classes.tiers)
    state = "held" + (best < int(tier_names.size()) ? ": " + tier_names[size_t(best)] : "");
  else if (best == r.classes.evicted())
    state = "evicted";
  else if (best == r.classes.rejected())
    state = "never admitted";
  auto at = [](int32_t s) { return s < 0 ? QString("never") : QString("at step %1").arg(s); };
  return QString("%1 · step %2: %3\nfed at step %4, admitted %5, evicted %6")
             .arg(token)
             .arg(row)
             .arg(state)
             .arg(head->fed_step[size_t(t)])
             .arg(at(head->lifetimes.admit_step[size_t(t)]))
             .arg(at(head->lifetimes.evict_step[size_t(t)])) +
         describe_merges(t, row);
}

QString TimelineFigure::describe_merges(int64_t t, int64_t at_step) const {
  constexpr int kListed = 6;  // tokens named per line; the rest counted
  auto listed = [](const std::vector<QString>& items) {
    QStringList out;
    for (size_t i = 0; i < items.size() && i < size_t(kListed); ++i) out << items[i];
    if (items.size() > size_t(kListed)) out << QString("%1 more").arg(items.size() - kListed);
    return out.join(", ");
  };
  std::vector<QString> into, from;
  int32_t out_step = -1;
  for (const trace::MergeRow& m : merges) {
    if (m.step > at_step) break;
    if (m.token == t) {
      into.push_back(QString::number(m.into));
      out_step = m.step;
    }
    if (m.into == t) from.push_back(QString("%1 (step %2)").arg(m.token).arg(m.step));
  }
  QString text;
  if (!into.empty())
    text += QString("\nvalue merged at step %1 into %2 entr%3: %4")
                .arg(out_step)
                .arg(into.size())
                .arg(into.size() == 1 ? "y" : "ies")
                .arg(listed(into));
  if (!from.empty())
    text += QString("\nabsorbed the values of %1 entr%2: %3")
                .arg(from.size())
                .arg(from.size() == 1 ? "y" : "ies")
                .arg(listed(from));
  return text;
}

TimelineFigure::Raster TimelineFigure::paint_head(QPainter& p, const QRectF& plot,
                                                  double scale) const {
  // Fold at the coarser of data and pixel resolution: with fewer steps (or
  // tokens) in view than pixels, one image cell per step (token) is scaled up
  // by the blit; with more, one cell per pixel folds many. Either way the
  // work is at most the plot's pixels.
  int w = std::max(1, int(plot.width() * scale)), h = std::max(1, int(plot.height() * scale));
  double s0 = viewport_.left(), s1 = viewport_.right(), t0 = viewport_.top(),
         t1 = viewport_.bottom();
  if (std::ceil(s1) - std::floor(s0) <= w) {
    s0 = std::floor(s0);
    s1 = std::ceil(s1);
    w = std::max(1, int(s1 - s0));
  }
  if (std::ceil(t1) - std::floor(t0) <= h) {
    t0 = std::floor(t0);
    t1 = std::ceil(t1);
    h = std::max(1, int(t1 - t0));
  }
  analysis::TimelineClasses cls{std::max<int64_t>(1, head->n_tiers)};
  const int C = cls.count();
  // Colour deltas from white per class, so a row converts with one pass.
  std::vector<float> dr, dg, db;
  std::vector<uint8_t> unread(size_t(C), 0);  // tiers the attention does not read
  for (int c = 0; c < C; ++c) {
    QColor k = timeline_class_color(cls, c, tier_attended);
    dr.push_back(float(k.red() - 255));
    dg.push_back(float(k.green() - 255));
    db.push_back(float(k.blue() - 255));
    unread[size_t(c)] =
        c < cls.tiers && size_t(c) < tier_attended.size() && !tier_attended[size_t(c)];
  }
  const bool hatched = std::find(unread.begin(), unread.end(), 1) != unread.end();
  QImage img(w, h, QImage::Format_RGB32);
  img.fill(Qt::white);
  // Alpha: each pixel's share of not-attended cells, where the hatch goes.
  QImage mask;
  if (hatched) {
    mask = QImage(w, h, QImage::Format_ARGB32);
    mask.fill(Qt::transparent);
  }
  const QRgb hatch = unattended::kHatch.rgb();
  analysis::fold_timeline_rows(*head, s0, s1, t0, t1, w, h, [&](int y, const float* cell) {
    QRgb* line = reinterpret_cast<QRgb*>(img.scanLine(y));
    QRgb* alpha = hatched ? reinterpret_cast<QRgb*>(mask.scanLine(y)) : nullptr;
    for (int x = 0; x < w; ++x, cell += C) {
      float rr = 255, gg = 255, bb = 255, cold = 0;
      for (int c = 0; c < C; ++c) {
        float s = std::min(cell[c], 1.f);
        rr += s * dr[size_t(c)];
        gg += s * dg[size_t(c)];
        bb += s * db[size_t(c)];
        if (unread[size_t(c)]) cold += s;
      }
      line[x] = qRgb(int(std::clamp(rr, 0.f, 255.f) + 0.5f), int(std::clamp(gg, 0.f, 255.f) + 0.5f),
                     int(std::clamp(bb, 0.f, 255.f) + 0.5f));
      if (alpha && cold > 0)
        alpha[x] = qRgba(qRed(hatch), qGreen(hatch), qBlue(hatch),
                         int(std::clamp(cold, 0.f, 1.f) * 255.f + 0.5f));
    }
  });
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  plot::Map my{viewport_.top(), viewport_.bottom(), plot.top(), plot.bottom()};
  QRectF target(QPointF(mx(s0), my(t0)), QPointF(mx(s1), my(t1)));
  p.save();
  p.setClipRect(plot);
  p.setRenderHint(QPainter::SmoothPixmapTransform, false);
  p.drawImage(target, img);
  p.restore();
  if (hatched) paint_hatch(p, plot, target, mask, scale);
  return {s0, s1, t0, t1, w, h, target};
}

void TimelineFigure::paint_hatch(QPainter& p, const QRectF& plot, const QRectF& target,
                                 const QImage& mask, double scale) const {
  // A layer of the plot's device pixels: the mask scaled up, then cut to the
  // hatch lines (DestinationIn keeps the layer only where the tile is
  // opaque). Lines stay one device pixel wide at any zoom; the work is the
  // plot's pixels.
  QImage layer(std::max(1, int(std::ceil(plot.width() * scale))),
               std::max(1, int(std::ceil(plot.height() * scale))),
               QImage::Format_ARGB32_Premultiplied);
  layer.fill(Qt::transparent);
  {
    QPainter lp(&layer);
    lp.setRenderHint(QPainter::SmoothPixmapTransform, false);
    lp.drawImage(QRectF((target.left() - plot.left()) * scale, (target.top() - plot.top()) * scale,
                        target.width() * scale, target.height() * scale),
                 mask);
    lp.setCompositionMode(QPainter::CompositionMode_DestinationIn);
    lp.fillRect(layer.rect(), unattended::hatch_brush());
  }
  p.save();
  p.setRenderHint(QPainter::SmoothPixmapTransform, false);
  p.drawImage(plot, layer);
  p.restore();
}

std::vector<int64_t> TimelineFigure::marks_in_view() const {
  std::vector<int64_t> n(mark_kinds.size(), 0);
  auto first = std::lower_bound(marks.begin(), marks.end(), int32_t(std::floor(viewport_.left())),
                                [](const Mark& m, int32_t s) { return m.step < s; });
  for (auto it = first; it != marks.end() && it->step < viewport_.right(); ++it)
    if (it->token + 1 > viewport_.top() && it->token < viewport_.bottom()) ++n[it->cls];
  return n;
}

bool TimelineFigure::dense_marks(int64_t count, double r, const QRectF& plot) {
  return double(count) * (2 * r) * (2 * r) > plot.width() * plot.height() / 6;
}

void TimelineFigure::paint_marks(QPainter& p, const QRectF& plot, const Raster& raster) const {
  if (marks.empty()) return;
  // Glyphs grow with the cells when zoomed in, within limits.
  double cell = std::min(plot.width() / viewport_.width(), plot.height() / viewport_.height());
  double r_promo = std::clamp(cell * 0.3, 2.4, 5.0), r_stall = std::clamp(cell * 0.4, 3.4, 7.0);
  std::vector<int64_t> in_view = marks_in_view();
  std::vector<uint8_t> dense(mark_kinds.size(), 0);
  bool any_dense = false;
  for (size_t k = 0; k < mark_kinds.size(); ++k) {
    dense[k] = dense_marks(in_view[k], mark_kinds[k].stall ? r_stall : r_promo, plot);
    any_dense |= bool(dense[k]);
  }
  if (any_dense) {
    // Dense classes colour their cells of the raster (one image pixel per
    // cell, or per device pixel when folded): promotions half covering,
    // stalls opaque and last, so they stay what the eye finds.
    QImage over(raster.w, raster.h, QImage::Format_ARGB32);
    over.fill(Qt::transparent);
    const double sx = raster.w / (raster.s1 - raster.s0), sy = raster.h / (raster.t1 - raster.t0);
    auto first = std::lower_bound(marks.begin(), marks.end(), int32_t(std::floor(raster.s0)),
                                  [](const Mark& m, int32_t s) { return m.step < s; });
    for (int pass = 0; pass < 2; ++pass)
      for (auto it = first; it != marks.end() && it->step < raster.s1; ++it) {
        const Mark& m = *it;
        const MarkClass& k = mark_kinds[m.cls];
        if (!dense[m.cls] || k.stall != (pass == 1)) continue;
        int x = int(std::floor((m.step + 0.5 - raster.s0) * sx));
        int y = int(std::floor((m.token + 0.5 - raster.t0) * sy));
        if (x < 0 || y < 0 || x >= raster.w || y >= raster.h) continue;
        QColor c = k.color;
        if (!k.stall) c.setAlpha(150);
        over.setPixel(x, y, c.rgba());
      }
    p.save();
    p.setClipRect(plot);
    p.setRenderHint(QPainter::SmoothPixmapTransform, false);
    p.drawImage(raster.target, over);
    p.restore();
  }
  std::vector<std::vector<QPointF>> promo = mark_positions(plot, 2 * r_promo);
  std::vector<std::vector<QPointF>> stall = mark_positions(plot, 2 * r_stall);
  p.save();
  p.setClipRect(plot.adjusted(-2, -2, 2, 2));
  // Promotions first, stalls on top: the stalls are what the reader hunts.
  for (size_t k = 0; k < mark_kinds.size(); ++k)
    if (!mark_kinds[k].stall && !dense[k])
      for (const QPointF& c : promo[k]) draw_promotion(p, c, mark_kinds[k].color, r_promo);
  for (size_t k = 0; k < mark_kinds.size(); ++k)
    if (mark_kinds[k].stall && !dense[k])
      for (const QPointF& c : stall[k]) draw_stall(p, c, r_stall);
  p.restore();
}

std::vector<LegendEntry> TimelineFigure::legend_entries(bool compact) const {
  std::vector<LegendEntry> out;
  analysis::TimelineClasses cls{std::max<int64_t>(1, int64_t(tier_names.size()))};
  for (int c = 0; c < cls.tiers; ++c) {
    bool read = size_t(c) >= tier_attended.size() || tier_attended[size_t(c)];
    QString name = tier_names[size_t(c)];
    if (read) {
      QColor k = palette::tier(c);
      out.push_back({"held: " + name, [k](QPainter& p, const QRectF& r) {
                       p.fillRect(r.adjusted(2, 1, -2, -1), k);
                     }});
    } else {
      out.push_back(
          {compact ? name + " (not attended)" : "held, not attended: " + name,
           [](QPainter& p, const QRectF& r) { unattended::fill(p, r.adjusted(2, 1, -2, -1)); }});
    }
  }
  if (any_evicted)
    out.push_back({"evicted", [cls](QPainter& p, const QRectF& r) {
                     p.fillRect(r.adjusted(2, 1, -2, -1), timeline_class_color(cls, cls.evicted()));
                   }});
  if (any_rejected)
    out.push_back({"never admitted", [cls](QPainter& p, const QRectF& r) {
                     p.fillRect(r.adjusted(2, 1, -2, -1),
                                timeline_class_color(cls, cls.rejected()));
                   }});
  add_mark_legend(out, mark_kinds, compact);
  add_task_legend(out, spans);
  add_reconstruction_legend(out, reconstruction);
  out.push_back(legend_line(compact ? "step" : QString("step %1").arg(step),
                            QPen(palette::kVermillion, 1.5)));
  if (selected_token >= 0)
    out.push_back(
        legend_line(compact ? "selected" : QString("selected token %1").arg(selected_token),
                    QPen(Qt::black, 1, Qt::DashLine)));
  return out;
}

void TimelineFigure::paint_layers(QPainter& p, const QRectF& plot, double scale) const {
  int w = std::max(1, int(plot.width() * scale));
  int L = int(n_layers);
  ColorScale cs;
  cs.lo = 0;
  cs.hi = float(std::max<int64_t>(1, n_kv_heads));
  QImage img(w, L, QImage::Format_RGB32);
  double t_per_px = viewport_.width() / w;
  for (int l = 0; l < L; ++l) {
    QRgb* line = reinterpret_cast<QRgb*>(img.scanLine(l));
    const uint16_t* row = counts.data() + int64_t(l) * n_tokens;
    for (int x = 0; x < w; ++x) {
      // Fold the tokens under this pixel column into their mean count.
      int64_t a = std::max<int64_t>(0, int64_t(std::floor(viewport_.left() + x * t_per_px)));
      int64_t b = std::min<int64_t>(
          n_tokens,
          std::max<int64_t>(a + 1, int64_t(std::floor(viewport_.left() + (x + 1) * t_per_px))));
      // Tokens not fed yet at the step are no data, not "held by 0 heads".
      double sum = 0;
      int64_t fed = 0;
      for (int64_t t = a; t < b; ++t)
        if (t >= int64_t(fed_step.size()) || fed_step[size_t(t)] <= step) {
          sum += row[t];
          ++fed;
        }
      line[x] = fed > 0 ? cs.color(float(sum / double(fed))) : qRgb(245, 245, 245);
    }
  }
  p.setRenderHint(QPainter::SmoothPixmapTransform, false);
  p.drawImage(plot, img);
}

void TimelineFigure::paint(QPainter& p, const QRectF& area) const {
  double scale = std::max(1.0, p.worldTransform().m11());
  if (mode == TimelineMode::Head) {
    Layout l = layout(area, p.device());
    plot::title(p, l.title, title(), QString("step %1 marked").arg(step));
    if (!head || n_tokens == 0) return plot::message(p, l.plot, "no tokens yet");
    Raster raster = paint_head(p, l.plot, scale);
    paint_marks(p, l.plot, raster);
    plot::Map mx{viewport_.left(), viewport_.right(), l.plot.left(), l.plot.right()};
    plot::Map my{viewport_.top(), viewport_.bottom(), l.plot.top(), l.plot.bottom()};
    p.save();
    p.setClipRect(l.plot);
    p.setPen(QPen(palette::kVermillion, 1.5));
    p.drawLine(QPointF(mx(step + 0.5), l.plot.top()), QPointF(mx(step + 0.5), l.plot.bottom()));
    if (selected_token >= 0) {
      p.setPen(QPen(Qt::black, 1, Qt::DashLine));
      p.drawLine(QPointF(l.plot.left(), my(selected_token + 0.5)),
                 QPointF(l.plot.right(), my(selected_token + 0.5)));
    }
    p.restore();
    paint_task_spans(p, l.plot, my, Qt::Vertical, spans);
    paint_step_ranges(p, l.plot, mx, reconstruction);
    if (l.token_rows) {  // 9 px or more a token: its text labels the row
      plot::x_axis(p, l.plot, viewport_.left(), viewport_.right(), "step");
      plot::token_labels(p, l.plot, my, Qt::Vertical,
                         std::max<int64_t>(0, int64_t(std::floor(viewport_.top()))),
                         std::min<int64_t>(n_tokens, int64_t(std::ceil(viewport_.bottom()))),
                         token_text.get(), kTokenLabelRoom, l.plot.height() / viewport_.height());
      plot::token_axis_title(p, l.plot, Qt::Vertical, kTokenLabelRoom, "token");
    } else {
      plot::axes(p, l.plot, viewport_.left(), viewport_.right(), viewport_.top(),
                 viewport_.bottom(), "step", "token", true);
    }
    paint_legend_rows(p, l.legend, legend_entries(l.compact));
    return;
  }
  const Layout fr = layout(area, p.device());
  plot::title(p, fr.title, title(),
              QString("colour: how many of the layer's %1 kv heads hold the token at step %2 "
                      "(grey: not fed yet)")
                  .arg(n_kv_heads)
                  .arg(step));
  if (counts.empty()) return plot::message(p, fr.plot, "no tokens yet");
  paint_layers(p, fr.plot, scale);
  paint_task_spans(p, fr.plot,
                   plot::Map{viewport_.left(), viewport_.right(), fr.plot.left(), fr.plot.right()},
                   Qt::Horizontal, spans);
  std::vector<LegendEntry> key = task_legend_short(spans);
  double key_h = legend_column_height(key);
  paint_legend_column(p, QPointF(fr.colorbar.left() - 4, fr.colorbar.bottom() - key_h + 8),
                      area.right() - fr.colorbar.left(), key);
  // Layers are rows: their numbers sit at the row centres (-0.5 .. L-0.5).
  if (fr.token_columns) {  // token strings as columns, as in the paper
    p.setPen(Qt::black);
    p.setBrush(Qt::NoBrush);
    p.drawRect(fr.plot);
    paint_token_columns(p, fr.plot);
    paint_layer_ticks(p, fr.plot);
    plot::axis_labels(p, fr.plot, "", "layer");
    plot::token_axis_title(p, fr.plot, Qt::Horizontal, kTokenLabelRoom, "token");
  } else {
    plot::axes(p, fr.plot, viewport_.left(), viewport_.right(), -0.5, double(n_layers) - 0.5,
               "token", "layer", true);
  }
  ColorScale cs;
  cs.lo = 0;
  cs.hi = float(std::max<int64_t>(1, n_kv_heads));
  plot::colorbar(p, fr.colorbar.adjusted(0, 0, 0, -key_h), cs,
                 QString("kv heads holding (of %1)").arg(n_kv_heads));
}

void TimelineFigure::paint_token_columns(QPainter& p, const QRectF& plot) const {
  const plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  plot::token_labels(p, plot, mx, Qt::Horizontal,
                     std::max<int64_t>(0, int64_t(std::floor(viewport_.left()))),
                     std::min<int64_t>(n_tokens, int64_t(std::ceil(viewport_.right()))),
                     token_text.get(), kTokenLabelRoom, plot.width() / viewport_.width());
}

void TimelineFigure::paint_layer_ticks(QPainter& p, const QRectF& plot) const {
  p.save();
  p.setFont(plot::font(8));
  p.setPen(Qt::black);
  QFontMetricsF fm(p.font());
  double row = plot.height() / double(std::max<int64_t>(1, n_layers));
  int64_t stride = std::max<int64_t>(1, int64_t(std::ceil(fm.height() * 1.2 / row)));
  for (int64_t l = 0; l < n_layers; l += stride) {
    double y = plot.top() + (double(l) + 0.5) * row;
    QString s = QString::number(l);
    p.drawLine(QPointF(plot.left() - 4, y), QPointF(plot.left(), y));
    p.drawText(QPointF(plot.left() - 6 - fm.horizontalAdvance(s), y + fm.ascent() / 2 - 1), s);
  }
  p.restore();
}

void TimelineFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  if (mode == TimelineMode::Head && head) {
    out << "token,text,fed_step,admit_step,evict_step,tier_intervals\n";
    for (int64_t t = 0; t < head->n_tokens(); ++t) {
      QString text = (*token_text)[size_t(t)];
      text.replace('"', "\"\"");
      out << t << ",\"" << text << "\"," << head->fed_step[size_t(t)] << ','
          << head->lifetimes.admit_step[size_t(t)] << ',' << head->lifetimes.evict_step[size_t(t)]
          << ",\"";
      for (int64_t i = head->interval_begin[size_t(t)]; i < head->interval_begin[size_t(t) + 1];
           ++i) {
        const trace::TierInterval& iv = head->intervals[size_t(i)];
        out << (i > head->interval_begin[size_t(t)] ? ";" : "") << int(iv.tier) << ':'
            << iv.begin_step << '-' << iv.end_step;
      }
      out << "\"\n";
    }
    // The head's stalls and promotions, each as its own table.
    out << "# stalls of layer " << layer << " kv head " << kv_head
        << " (/stalls: a reactive fetch of a not-attended entry made the step wait)\n";
    out << "stall_step,token,wait_s,needed\n";
    for (const trace::StallRow& r : stalls)
      out << r.step << ',' << r.token << ',' << r.wait_s << ',' << int(r.needed) << '\n';
    out << "# promotions of layer " << layer << " kv head " << kv_head << "\n";
    out << "promote_step,token,from_tier,to_tier,reason\n";
    for (const trace::Event& e : promotions) {
      QString reason;
      for (const MarkClass& k : mark_kinds)
        if (!k.stall && k.reason == e.reason) reason = k.label;
      reason.replace('"', "\"\"");
      out << e.step << ',' << e.token << ',' << int(e.from_tier) << ',' << int(e.to_tier) << ",\""
          << reason << "\"\n";
    }
    return;
  }
  out << "layer,token,heads_holding\n";
  for (int64_t l = 0; l < n_layers; ++l)
    for (int64_t t = 0; t < n_tokens; ++t)
      out << l << ',' << t << ',' << counts[size_t(l * n_tokens + t)] << '\n';
}

}  // namespace kvscope::views
