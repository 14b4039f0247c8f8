#include "views/timeline_figure.h"

#include <algorithm>
#include <cmath>

namespace kvscope::views {

QColor timeline_class_color(const analysis::TimelineClasses& classes, int c) {
  if (c < classes.tiers) return palette::tier(c);
  if (c == classes.evicted()) return QColor(240, 190, 160);  // light vermillion
  return QColor(110, 110, 110);                              // rejected
}

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
  f->n_layers = r.n_layers();
  f->n_kv_heads = r.n_kv_heads();
  f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, b.n_steps - 1));
  f->selected_token = sel.token();
  for (const std::string& n : r.run().tier_names)
    f->tier_names.push_back(QString::fromStdString(n));
  auto texts = std::make_shared<std::vector<QString>>();
  for (const trace::TokenRecord& t : b.tokens)
    texts->push_back(QString::fromUtf8(t.text.data(), int(t.text.size())));
  f->token_text = texts;
  if (mode == TimelineMode::Head) {
    f->head = std::make_shared<analysis::HeadTimeline>(
        analysis::HeadTimeline::read(r, f->layer, f->kv_head));
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

QRectF TimelineFigure::plot_rect(const QRectF& area) {
  return plot::frame(area, true, 70, 48).plot;
}

QString TimelineFigure::title() const {
  if (mode == TimelineMode::Head)
    return QString("Eviction timeline · layer %1 · kv head %2").arg(layer).arg(kv_head);
  return QString("Heads holding each token · step %1").arg(step);
}

QColor TimelineFigure::cell_color(int64_t s, int64_t t) const {
  if (!head) return QColor();
  analysis::TimelineRaster r =
      analysis::fold_timeline(*head, double(s), double(s + 1), double(t), double(t + 1), 1, 1);
  double rr = 255, gg = 255, bb = 255;
  for (int c = 0; c < r.classes.count(); ++c) {
    float w = r.at(0, 0, c);
    QColor k = timeline_class_color(r.classes, c);
    rr += w * (k.red() - 255);
    gg += w * (k.green() - 255);
    bb += w * (k.blue() - 255);
  }
  return QColor(int(std::lround(rr)), int(std::lround(gg)), int(std::lround(bb)));
}

void TimelineFigure::paint_head(QPainter& p, const QRectF& plot, double scale) const {
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
  for (int c = 0; c < C; ++c) {
    QColor k = timeline_class_color(cls, c);
    dr.push_back(float(k.red() - 255));
    dg.push_back(float(k.green() - 255));
    db.push_back(float(k.blue() - 255));
  }
  QImage img(w, h, QImage::Format_RGB32);
  img.fill(Qt::white);
  analysis::fold_timeline_rows(*head, s0, s1, t0, t1, w, h, [&](int y, const float* cell) {
    QRgb* line = reinterpret_cast<QRgb*>(img.scanLine(y));
    for (int x = 0; x < w; ++x, cell += C) {
      float rr = 255, gg = 255, bb = 255;
      for (int c = 0; c < C; ++c) {
        float s = std::min(cell[c], 1.f);
        rr += s * dr[size_t(c)];
        gg += s * dg[size_t(c)];
        bb += s * db[size_t(c)];
      }
      line[x] = qRgb(int(std::clamp(rr, 0.f, 255.f) + 0.5f), int(std::clamp(gg, 0.f, 255.f) + 0.5f),
                     int(std::clamp(bb, 0.f, 255.f) + 0.5f));
    }
  });
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  plot::Map my{viewport_.top(), viewport_.bottom(), plot.top(), plot.bottom()};
  p.save();
  p.setClipRect(plot);
  p.setRenderHint(QPainter::SmoothPixmapTransform, false);
  p.drawImage(QRectF(QPointF(mx(s0), my(t0)), QPointF(mx(s1), my(t1))), img);
  p.restore();
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
  plot::Frame fr = plot::frame(area, true, 70, 48);
  double scale = std::max(1.0, p.worldTransform().m11());
  if (mode == TimelineMode::Head) {
    plot::title(p, fr.title, title(), QString("step %1 marked").arg(step));
    if (!head || n_tokens == 0) return plot::message(p, fr.plot, "no tokens yet");
    paint_head(p, fr.plot, scale);
    plot::Map mx{viewport_.left(), viewport_.right(), fr.plot.left(), fr.plot.right()};
    plot::Map my{viewport_.top(), viewport_.bottom(), fr.plot.top(), fr.plot.bottom()};
    p.save();
    p.setClipRect(fr.plot);
    p.setPen(QPen(palette::kVermillion, 1.5));
    p.drawLine(QPointF(mx(step + 0.5), fr.plot.top()), QPointF(mx(step + 0.5), fr.plot.bottom()));
    if (selected_token >= 0) {
      p.setPen(QPen(Qt::black, 1, Qt::DashLine));
      p.drawLine(QPointF(fr.plot.left(), my(selected_token + 0.5)),
                 QPointF(fr.plot.right(), my(selected_token + 0.5)));
    }
    p.restore();
    plot::axes(p, fr.plot, viewport_.left(), viewport_.right(), viewport_.top(), viewport_.bottom(),
               "step", "token", true);
    // Legend in the colour-bar column.
    analysis::TimelineClasses cls{std::max<int64_t>(1, int64_t(tier_names.size()))};
    p.save();
    p.setFont(plot::font(7));
    double y = fr.colorbar.top();
    for (int c = 0; c < cls.count(); ++c) {
      QString name = c < cls.tiers ? "held: " + tier_names[size_t(c)]
                                   : (c == cls.evicted() ? "evicted" : "never admitted");
      p.fillRect(QRectF(fr.colorbar.left() - 6, y, 10, 10), timeline_class_color(cls, c));
      p.setPen(Qt::black);
      p.drawText(QRectF(fr.colorbar.left() + 8, y - 2, 70, 14), Qt::AlignLeft | Qt::AlignVCenter,
                 name);
      y += 16;
    }
    p.restore();
    return;
  }
  plot::title(p, fr.title, title(),
              QString("colour: how many of the layer's %1 kv heads hold the token at step %2 "
                      "(grey: not fed yet)")
                  .arg(n_kv_heads)
                  .arg(step));
  if (counts.empty()) return plot::message(p, fr.plot, "no tokens yet");
  paint_layers(p, fr.plot, scale);
  // Layers are rows: their numbers sit at the row centres (-0.5 .. L-0.5).
  if (fr.plot.width() / viewport_.width() >= 9) {  // token strings as columns, as in the paper
    p.setPen(Qt::black);
    p.setBrush(Qt::NoBrush);
    p.drawRect(fr.plot);
    paint_token_columns(p, fr.plot);
    paint_layer_ticks(p, fr.plot);
    plot::axis_labels(p, fr.plot, "", "layer");
  } else {
    plot::axes(p, fr.plot, viewport_.left(), viewport_.right(), -0.5, double(n_layers) - 0.5,
               "token", "layer", true);
  }
  ColorScale cs;
  cs.lo = 0;
  cs.hi = float(std::max<int64_t>(1, n_kv_heads));
  plot::colorbar(p, fr.colorbar, cs, QString("kv heads holding (of %1)").arg(n_kv_heads));
}

void TimelineFigure::paint_token_columns(QPainter& p, const QRectF& plot) const {
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  double px_per_token = plot.width() / viewport_.width();
  p.save();
  p.setFont(plot::font(std::clamp(px_per_token * 0.55, 5.0, 8.0)));
  p.setPen(Qt::black);
  QFontMetricsF fm(p.font());  // the painter's font: metrics at the device's DPI
  for (int64_t t = std::max<int64_t>(0, int64_t(std::floor(viewport_.left())));
       t < std::min<int64_t>(n_tokens, int64_t(std::ceil(viewport_.right()))); ++t) {
    if (mx(t + 0.5) < plot.left() || mx(t + 0.5) > plot.right()) continue;  // half in view
    // "index text" when it fits below the plot, else the text alone, elided.
    QString text = (*token_text)[size_t(t)].simplified();
    QString full = QString::number(t) + " " + text;
    QString label =
        fm.horizontalAdvance(full) <= 44 ? full : fm.elidedText(text, Qt::ElideRight, 44);
    p.save();
    p.translate(mx(t + 0.5) + fm.ascent() / 2 - 1, plot.bottom() + 4);
    p.rotate(90);
    p.drawText(QPointF(0, 0), label);
    p.restore();
  }
  p.restore();
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
    return;
  }
  out << "layer,token,heads_holding\n";
  for (int64_t l = 0; l < n_layers; ++l)
    for (int64_t t = 0; t < n_tokens; ++t)
      out << l << ',' << t << ',' << counts[size_t(l * n_tokens + t)] << '\n';
}

}  // namespace kvscope::views
