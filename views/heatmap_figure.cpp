#include "views/heatmap_figure.h"

#include "views/task_marks.h"

#include <QPainterPath>
#include <algorithm>
#include <cmath>

namespace kvscope::views {

namespace {

// Room for a zoomed heatmap's token labels: query labels left of the plot,
// key labels (rotated) below it.
constexpr double kQueryLabelRoom = 64, kKeyLabelRoom = 52;

// Keys the policy does not hold at the step: the strip above the map.
const QColor kNotHeldColor{70, 70, 70};
}  // namespace

namespace {

QRectF grid_tokens(const analysis::AttentionGrid& g) {
  double c = double(g.cell_tokens);
  return QRectF(g.col_begin * c, g.row_begin * c, g.cols() * c, g.rows() * c);
}

std::shared_ptr<const std::vector<QString>> texts_of(TraceData& data) {
  auto out = std::make_shared<std::vector<QString>>();
  for (const trace::TokenRecord& t : data.basics().tokens)
    out->push_back(QString::fromUtf8(t.text.data(), int(t.text.size())));
  return out;
}

}  // namespace

std::shared_ptr<HeatmapFigure> HeatmapFigure::load(TraceData& data, const Selection& sel,
                                                   const HeatmapOptions& options, QSizeF pixels) {
  const trace::TraceReader& r = data.reader();
  auto f = std::make_shared<HeatmapFigure>();
  f->trace = r.path();
  f->layer = sel.layer;
  f->head = sel.head;
  f->kv_head = sel.kv_head();
  f->options_ = options;
  const TraceBasics& b = data.basics();
  f->n_tokens = b.n_tokens;
  f->token_text = texts_of(data);
  f->spans = task_spans(b.tokens);
  f->selected = sel.tokens;
  f->set_step_state(data, sel.step);
  int dense = options.prefer_dense ? analysis::dense_index_of(r, f->layer, f->head) : -1;
  if (dense >= 0) {
    // Token resolution: the dense rows of this head, pooled to fit on the fly.
    f->dense_index = dense;
    f->available = true;
    f->block = 1;
    int64_t T = std::max<int64_t>(1, f->n_tokens);
    f->coarse_ =
        analysis::dense_view(r, dense, 0, T, 0, T, options.coarse_cells, options.coarse_cells);
    f->source_note = "dense rows (token resolution)";
    f->viewport_ = QRectF(0, 0, double(T), double(T));
  } else {
    f->available = r.layout().pooled_block > 0 && r.pooled_query_blocks() > 0;
    f->block = std::max<int64_t>(1, r.layout().pooled_block);
    if (!f->available) {
      f->source_note = "no pooled attention in this trace (capture level 'pooled')";
      f->viewport_ =
          QRectF(0, 0, std::max<int64_t>(1, f->n_tokens), std::max<int64_t>(1, f->n_tokens));
      return f;
    }
    int64_t rows = r.pooled_query_blocks(), cols = r.pooled_key_blocks();
    auto lod = data.lod();
    f->coarse_ = analysis::attention_view(r, lod.get(), f->layer, f->head, 0, rows, 0, cols,
                                          options.coarse_cells, options.coarse_cells);
    // Where the cells came from (the LOD cache or the trace) is the tool's
    // business, not the figure's: no note.
    f->viewport_ =
        QRectF(0, 0, double(std::min(cols * f->block, std::max<int64_t>(f->n_tokens, 1))),
               double(std::min(rows * f->block, std::max<int64_t>(f->n_tokens, 1))));
  }
  if (f->wants_detail(pixels))
    f->set_detail(
        load_detail(data, f->layer, f->head, f->viewport_, pixels, f->block, f->dense_index));
  return f;
}

void HeatmapFigure::set_step_state(TraceData& data, int64_t new_step) {
  const TraceBasics& b = data.basics();
  step = std::clamp<int64_t>(new_step, 0, std::max<int64_t>(0, b.n_steps - 1));
  if (!b.steps.empty()) {
    const trace::StepRecord& s = b.steps[size_t(step)];
    step_token_begin = s.first_token;
    step_token_end = s.first_token + s.n_tokens;
  }
  trace::HeadLifetimes lt = data.reader().lifetimes(layer, kv_head, 0, n_tokens);
  key_held.resize(size_t(n_tokens));
  not_held_prefix_.assign(size_t(n_tokens + 1), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    bool held = analysis::held_at(lt.admit_step[size_t(t)], lt.evict_step[size_t(t)], step);
    key_held[size_t(t)] = held;
    // Only keys that exist at the step can be "no longer held".
    bool gone = !held && b.fed_step[size_t(t)] <= step;
    not_held_prefix_[size_t(t + 1)] = not_held_prefix_[size_t(t)] + (gone ? 1 : 0);
  }
}

std::shared_ptr<HeatmapFigure> HeatmapFigure::at_step(TraceData& data, int64_t new_step) const {
  auto f = std::make_shared<HeatmapFigure>(*this);
  f->set_step_state(data, new_step);
  return f;
}

analysis::AttentionGrid HeatmapFigure::load_detail(TraceData& data, int layer, int head,
                                                   const QRectF& v, QSizeF pixels, int64_t block,
                                                   int dense_index) {
  const trace::TraceReader& r = data.reader();
  if (dense_index >= 0)
    return analysis::dense_view(r, dense_index, int64_t(std::floor(v.top())),
                                int64_t(std::ceil(v.bottom())), int64_t(std::floor(v.left())),
                                int64_t(std::ceil(v.right())), pixels.width(), pixels.height());
  auto lod = data.lod();
  int64_t r0 = int64_t(std::floor(v.top() / block)), r1 = int64_t(std::ceil(v.bottom() / block));
  int64_t c0 = int64_t(std::floor(v.left() / block)), c1 = int64_t(std::ceil(v.right() / block));
  r0 = std::max<int64_t>(0, r0);
  c0 = std::max<int64_t>(0, c0);
  r1 = std::min(r.pooled_query_blocks(), std::max(r0 + 1, r1));
  c1 = std::min(r.pooled_key_blocks(), std::max(c0 + 1, c1));
  return analysis::attention_view(r, lod.get(), layer, head, r0, r1, c0, c1, pixels.width(),
                                  pixels.height());
}

QRectF HeatmapFigure::extent() const {
  if (!available) return viewport_;
  QRectF g = grid_tokens(coarse_);
  return QRectF(0, 0, std::min(g.width(), double(std::max<int64_t>(1, n_tokens))),
                std::min(g.height(), double(std::max<int64_t>(1, n_tokens))));
}

void HeatmapFigure::set_viewport(const QRectF& v) {
  QRectF e = extent();
  double w = std::clamp(v.width(), 1.0, e.width()), h = std::clamp(v.height(), 1.0, e.height());
  double x = std::clamp(v.left(), e.left(), e.right() - w);
  double y = std::clamp(v.top(), e.top(), e.bottom() - h);
  viewport_ = QRectF(x, y, w, h);
}

void HeatmapFigure::set_options(const HeatmapOptions& o) {
  options_ = o;
  coarse_image_ = QImage();
  detail_image_ = QImage();
}

void HeatmapFigure::set_detail(analysis::AttentionGrid grid, QImage image) {
  detail_ = std::move(grid);
  detail_image_ = std::move(image);
}

QImage HeatmapFigure::colorize_grid(const analysis::AttentionGrid& g, const HeatmapOptions& o,
                                    const ColorScale& scale) {
  return colorize(o.use_max ? g.max : g.mean, int(g.rows()), int(g.cols()), scale);
}

bool HeatmapFigure::wants_detail(QSizeF pixels) const {
  if (!available) return false;
  int want = analysis::level_for_pixels(int64_t(std::ceil(viewport_.height() / block)),
                                        int64_t(std::ceil(viewport_.width() / block)),
                                        pixels.width(), pixels.height());
  const analysis::AttentionGrid* have = detail_ ? &*detail_ : nullptr;
  if (want >= coarse_.level) return false;  // the coarse grid is fine enough
  if (!have || have->level != want) return true;
  QRectF covered = grid_tokens(*have);
  return !covered.adjusted(-0.5, -0.5, 0.5, 0.5).contains(viewport_);
}

QRectF HeatmapFigure::plot_rect(const QRectF& area) {
  return plot::frame(area, true, 70, 48).plot;
}

ColorScale HeatmapFigure::scale() const {
  if (!options_.auto_range) {
    ColorScale s;
    s.map = options_.map;
    s.log = options_.log;
    s.lo = options_.lo;
    s.hi = options_.hi;
    return s;
  }
  return ColorScale::fit(options_.use_max ? coarse_.max : coarse_.mean, options_.map, options_.log);
}

float HeatmapFigure::value_at(double key, double query) const {
  for (const analysis::AttentionGrid* g : {detail_ ? &*detail_ : nullptr, &coarse_}) {
    if (!g || g->rows() == 0) continue;
    int64_t r = int64_t(std::floor(query / double(g->cell_tokens))) - g->row_begin;
    int64_t c = int64_t(std::floor(key / double(g->cell_tokens))) - g->col_begin;
    if (r < 0 || c < 0 || r >= g->rows() || c >= g->cols()) continue;
    return (options_.use_max ? g->max : g->mean)[size_t(r * g->cols() + c)];
  }
  return NAN;
}

QString HeatmapFigure::title() const {
  return QString("Attention · layer %1 · head %2 (kv %3) · step %4")
      .arg(layer)
      .arg(head)
      .arg(kv_head)
      .arg(step);
}

void HeatmapFigure::paint_grid(QPainter& p, const QRectF& plot, const analysis::AttentionGrid& g,
                               QImage& cache) const {
  if (g.rows() == 0 || g.cols() == 0) return;
  if (cache.isNull()) cache = colorize_grid(g, options_, scale());
  QRectF data = grid_tokens(g).intersected(viewport_);
  if (data.isEmpty()) return;
  double c = double(g.cell_tokens);
  QRectF source((data.left() - g.col_begin * c) / c, (data.top() - g.row_begin * c) / c,
                data.width() / c, data.height() / c);
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  plot::Map my{viewport_.top(), viewport_.bottom(), plot.top(), plot.bottom()};
  QRectF target(QPointF(mx(data.left()), my(data.top())),
                QPointF(mx(data.right()), my(data.bottom())));
  // Nearest-neighbour: a cell is a cell; cost follows the target's pixels.
  p.setRenderHint(QPainter::SmoothPixmapTransform, false);
  p.drawImage(target, cache, source);
}

void HeatmapFigure::paint_evicted(QPainter& p, const QRectF& plot) const {
  if (!options_.show_evicted || n_tokens == 0) return;
  plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  // One pass over pixel columns: the share of each column's keys not held.
  const int cols = std::max(1, int(plot.width()));
  auto share_at = [&](int x) {
    double a = mx.inverse(plot.left() + x), b = mx.inverse(plot.left() + x + 1);
    int64_t ta = std::clamp<int64_t>(int64_t(std::floor(a)), 0, n_tokens);
    int64_t tb = std::clamp<int64_t>(std::max<int64_t>(int64_t(std::ceil(b)), ta + 1), 0, n_tokens);
    if (tb <= ta) return 0.0;
    return double(not_held_prefix_[size_t(tb)] - not_held_prefix_[size_t(ta)]) / double(tb - ta);
  };
  // Runs of equal (quantised) share become one rectangle: few draw calls,
  // small SVG/PDF output.
  int run_start = 0, run_level = -1;
  auto flush = [&](int end) {
    if (run_level <= 0) return;
    QRectF r(plot.left() + run_start, plot.top(), end - run_start, plot.height());
    p.fillRect(r, QColor(255, 255, 255, 20 + run_level * 12));
    // The strip above the plot: opaque, white to dark grey by the share not
    // held (an alpha vermillion read differently in PNG and PDF and took the
    // needle's colour).
    double share = run_level / 8.0;
    p.fillRect(QRectF(r.left(), plot.top() - 6, r.width(), 5),
               QColor(int(255 + share * (kNotHeldColor.red() - 255)),
                      int(255 + share * (kNotHeldColor.green() - 255)),
                      int(255 + share * (kNotHeldColor.blue() - 255))));
  };
  for (int x = 0; x <= cols; ++x) {
    int level = x < cols ? int(std::lround(share_at(x) * 8)) : -2;
    if (level != run_level) {
      flush(x);
      run_start = x;
      run_level = level;
    }
  }
}

void HeatmapFigure::paint_token_labels(QPainter& p, const QRectF& plot) const {
  const plot::Map mx{viewport_.left(), viewport_.right(), plot.left(), plot.right()};
  const plot::Map my{viewport_.top(), viewport_.bottom(), plot.top(), plot.bottom()};
  const double px_x = plot.width() / viewport_.width(), px_y = plot.height() / viewport_.height();
  const double px = std::min(px_x, px_y);
  const std::vector<QString>* texts = token_text.get();
  const int64_t k0 = std::max<int64_t>(0, int64_t(std::floor(viewport_.left())));
  const int64_t k1 = std::min<int64_t>(n_tokens, int64_t(std::ceil(viewport_.right())));
  const int64_t q0 = std::max<int64_t>(0, int64_t(std::floor(viewport_.top())));
  const int64_t q1 = std::min<int64_t>(n_tokens, int64_t(std::ceil(viewport_.bottom())));
  if (px_x >= 9) plot::token_labels(p, plot, mx, Qt::Horizontal, k0, k1, texts, kKeyLabelRoom, px);
  if (px_y >= 9) plot::token_labels(p, plot, my, Qt::Vertical, q0, q1, texts, kQueryLabelRoom, px);
  plot::token_axis_title(p, plot, Qt::Horizontal, kKeyLabelRoom, "key token");
  plot::token_axis_title(p, plot, Qt::Vertical, kQueryLabelRoom, "query token");
}

// The selected tokens as key columns outlined in black (runs of adjacent
// tokens as one outline): where the selection's attention comes in.
void HeatmapFigure::paint_selected(QPainter& p, const QRectF& plot, const plot::Map& mkey) const {
  if (selected.empty()) return;
  p.save();
  p.setClipRect(plot);
  p.setPen(QPen(Qt::black, 1.2, Qt::DashLine));
  p.setBrush(Qt::NoBrush);
  for (size_t i = 0; i < selected.size();) {
    size_t j = i + 1;
    while (j < selected.size() && selected[j] == selected[j - 1] + 1) ++j;
    double a = mkey(double(selected[i])), z = mkey(double(selected[j - 1] + 1));
    if (z - a < 2) a -= 1, z += 1;
    p.drawRect(QRectF(QPointF(a, plot.top()), QPointF(z, plot.bottom())));
    i = j;
  }
  p.restore();
}

bool HeatmapFigure::labels_tokens(const QRectF& plot) const {
  return plot.width() / viewport_.width() >= 9 || plot.height() / viewport_.height() >= 9;
}

// Zoomed to where a token is 9 px or more, token labels replace the ticks
// and need margins for themselves and the axis titles beyond them.
plot::Frame HeatmapFigure::frame(const QRectF& area) const {
  const plot::Frame plain = plot::frame(area, true, 70, 48);
  if (!labels_tokens(plain.plot)) return plain;
  const plot::Frame labelled = plot::frame(area, true, kQueryLabelRoom + 30, kKeyLabelRoom + 30);
  return labels_tokens(labelled.plot) ? labelled : plain;
}

QRectF HeatmapFigure::zoomed_plot_rect(const QRectF& area) const {
  return frame(area).plot;
}

QString HeatmapFigure::missing_data() const {
  return available ? QString() : source_note;
}

void HeatmapFigure::paint(QPainter& p, const QRectF& area) const {
  const plot::Frame fr = frame(area);
  const bool zoomed = labels_tokens(fr.plot);
  QString subtitle = dense_index >= 0 ? QString("attention weight")
                                      : QString("%1 of %2-token blocks")
                                            .arg(options_.use_max ? "pooled max" : "pooled mean")
                                            .arg(block);
  if (!source_note.isEmpty()) subtitle += ", " + source_note;
  plot::title(p, fr.title, title(), subtitle);
  if (!available) {
    plot::message(p, fr.plot, source_note);
    return;
  }
  p.save();
  p.setClipRect(fr.plot);
  p.fillRect(fr.plot, QColor(248, 248, 248));
  paint_grid(p, fr.plot, coarse_, coarse_image_);
  if (detail_ && detail_->level < coarse_.level) paint_grid(p, fr.plot, *detail_, detail_image_);
  p.setClipRect(fr.plot.adjusted(0, -8, 0, 0));
  paint_evicted(p, fr.plot);
  plot::Map my{viewport_.top(), viewport_.bottom(), fr.plot.top(), fr.plot.bottom()};
  if (step_token_end > step_token_begin) {
    QPen pen(palette::kVermillion, 1.5, Qt::DashLine);
    p.setPen(pen);
    p.setBrush(Qt::NoBrush);
    p.drawRect(QRectF(QPointF(fr.plot.left(), my(double(step_token_begin))),
                      QPointF(fr.plot.right(), my(double(step_token_end)))));
  }
  p.restore();
  // The task's needle and question on both token axes.
  plot::Map mkey{viewport_.left(), viewport_.right(), fr.plot.left(), fr.plot.right()};
  paint_selected(p, fr.plot, mkey);
  paint_task_spans(p, fr.plot, mkey, Qt::Horizontal, spans);
  paint_task_spans(p, fr.plot, my, Qt::Vertical, spans);
  // The key under the colour bar: what the marks outside the colour scale mean.
  std::vector<LegendEntry> key;
  if (options_.show_evicted && n_tokens > 0 && not_held_prefix_.back() > 0)
    key.push_back(legend_box("not held", kNotHeldColor));
  for (LegendEntry& e : task_legend_short(spans)) key.push_back(std::move(e));
  if (!selected.empty())  // the selected tokens' key columns, outlined
    key.push_back({"selected", [](QPainter& p, const QRectF& r) {
                     p.setPen(QPen(Qt::black, 1.2, Qt::DashLine));
                     p.setBrush(Qt::NoBrush);
                     p.drawRect(r.adjusted(3, 1, -3, -1));
                   }});
  if (step_token_end > step_token_begin)
    key.push_back(legend_line("this step", QPen(palette::kVermillion, 1.5, Qt::DashLine)));
  double key_h = legend_column_height(key);
  paint_legend_column(p, QPointF(fr.colorbar.left() - 4, fr.colorbar.bottom() - key_h + 8),
                      area.right() - fr.colorbar.left(), key);
  if (zoomed) {
    p.setPen(Qt::black);
    p.drawRect(fr.plot);
    paint_token_labels(p, fr.plot);
  } else {
    plot::axes(p, fr.plot, viewport_.left(), viewport_.right(), viewport_.top(), viewport_.bottom(),
               "key token", "query token", true);
  }
  plot::colorbar(p, fr.colorbar.adjusted(0, 0, 0, -key_h), scale(),
                 dense_index >= 0 ? "attention weight"
                                  : (options_.use_max ? "max attention" : "mean attention"));
}

void HeatmapFigure::write_csv(QTextStream& out) const {
  out << "# " << title() << "\n";
  out << "query_token_begin,query_token_end,key_token_begin,key_token_end,max,mean,key_held_at_"
         "step\n";
  const analysis::AttentionGrid& g = detail_ ? *detail_ : coarse_;
  for (int64_t r = 0; r < g.rows(); ++r)
    for (int64_t c = 0; c < g.cols(); ++c) {
      int64_t q0 = (g.row_begin + r) * g.cell_tokens, k0 = (g.col_begin + c) * g.cell_tokens;
      int64_t k1 = std::min(k0 + g.cell_tokens, n_tokens);
      int64_t held = 0;
      for (int64_t t = k0; t < k1; ++t) held += key_held[size_t(t)];
      size_t i = size_t(r * g.cols() + c);
      out << q0 << ',' << q0 + g.cell_tokens << ',' << k0 << ',' << k0 + g.cell_tokens << ','
          << g.max[i] << ',' << g.mean[i] << ',' << held << '\n';
    }
}

}  // namespace kvscope::views
