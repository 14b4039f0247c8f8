#include "core/analysis/lifetimes.h"

#include <algorithm>
#include <cmath>

namespace kvscope::analysis {

AllLifetimes AllLifetimes::read(const trace::TraceReader& reader, int64_t token_begin,
                                int64_t token_end) {
  AllLifetimes all;
  all.layers = reader.n_layers();
  all.kv_heads = reader.n_kv_heads();
  all.token_begin = token_begin;
  all.token_end = token_end < 0 ? reader.n_tokens() : token_end;
  size_t n = size_t(all.n_tokens());
  all.admit.resize(size_t(all.layers * all.kv_heads) * n);
  all.evict.resize(all.admit.size());
  for (int64_t l = 0; l < all.layers; ++l)
    for (int64_t k = 0; k < all.kv_heads; ++k) {
      trace::HeadLifetimes h = reader.lifetimes(int(l), int(k), all.token_begin, all.token_end);
      size_t at = all.index(l, k, all.token_begin);
      std::copy(h.admit_step.begin(), h.admit_step.end(), all.admit.begin() + long(at));
      std::copy(h.evict_step.begin(), h.evict_step.end(), all.evict.begin() + long(at));
    }
  return all;
}

int AllLifetimes::heads_holding(int64_t layer, int64_t token, int64_t step) const {
  int n = 0;
  for (int64_t k = 0; k < kv_heads; ++k) n += held(layer, k, token, step) ? 1 : 0;
  return n;
}

std::vector<int32_t> AllLifetimes::held_counts(int64_t step) const {
  std::vector<int32_t> out(size_t(layers * kv_heads), 0);
  int64_t n = n_tokens();
  for (int64_t slot = 0; slot < layers * kv_heads; ++slot) {
    const int32_t* a = admit.data() + slot * n;
    const int32_t* e = evict.data() + slot * n;
    int32_t c = 0;
    for (int64_t t = 0; t < n; ++t) c += held_at(a[t], e[t], step) ? 1 : 0;
    out[size_t(slot)] = c;
  }
  return out;
}

std::vector<uint16_t> layer_head_counts(const AllLifetimes& all, int64_t step) {
  int64_t n = all.n_tokens();
  std::vector<uint16_t> out(size_t(all.layers * n), 0);
  for (int64_t l = 0; l < all.layers; ++l)
    for (int64_t k = 0; k < all.kv_heads; ++k) {
      size_t base = all.index(l, k, all.token_begin);
      uint16_t* row = out.data() + l * n;
      for (int64_t t = 0; t < n; ++t)
        row[t] += held_at(all.admit[base + size_t(t)], all.evict[base + size_t(t)], step) ? 1 : 0;
    }
  return out;
}

HeadTimeline HeadTimeline::read(const trace::TraceReader& reader, int layer, int kv_head) {
  HeadTimeline h;
  h.layer = layer;
  h.kv_head = kv_head;
  h.n_steps = reader.n_steps();
  h.n_tiers = reader.n_tiers();
  h.lifetimes = reader.lifetimes(layer, kv_head);
  int64_t n = reader.n_tokens();
  h.fed_step.resize(size_t(n));
  // Tokens are fed in order by steps: expand the step table instead of
  // reading every token's record.
  std::vector<trace::StepRecord> steps = reader.steps(0, h.n_steps);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int32_t i = 0; i < steps[s].n_tokens; ++i) {
      int64_t t = int64_t(steps[s].first_token) + i;
      if (t >= 0 && t < n) h.fed_step[size_t(t)] = int32_t(s);
    }
  if (h.n_tiers > 1) {
    h.intervals = reader.intervals(layer, kv_head);
    std::stable_sort(h.intervals.begin(), h.intervals.end(),
                     [](const trace::TierInterval& a, const trace::TierInterval& b) {
                       return a.token != b.token ? a.token < b.token : a.begin_step < b.begin_step;
                     });
  }
  h.interval_begin.assign(size_t(n + 1), 0);
  for (const trace::TierInterval& iv : h.intervals)
    if (iv.token >= 0 && iv.token < n) ++h.interval_begin[size_t(iv.token) + 1];
  for (int64_t t = 0; t < n; ++t) h.interval_begin[size_t(t + 1)] += h.interval_begin[size_t(t)];
  return h;
}

namespace {

// Adds coverage of [xa, xb) (pixel units) with weight w to one raster row:
// partial pixels directly, whole pixels through a difference array.
struct RowAccumulator {
  int width, classes;
  std::vector<float>* share;  // the row's cells
  std::vector<float>* diff;   // (width + 1) * classes

  void add(double xa, double xb, int c, float w) {
    xa = std::max(0.0, xa);
    xb = std::min(double(width), xb);
    if (!(xb > xa)) return;
    int ia = int(std::floor(xa)), ib = int(std::floor(xb));
    if (ib >= width) ib = width - 1, xb = std::min(xb, double(width));
    if (ia == ib) {
      (*share)[size_t(ia * classes + c)] += w * float(xb - xa);
      return;
    }
    (*share)[size_t(ia * classes + c)] += w * float(ia + 1 - xa);
    double tail = xb - ib;
    if (tail > 0 && ib < width) (*share)[size_t(ib * classes + c)] += w * float(tail);
    (*diff)[size_t((ia + 1) * classes + c)] += w;
    (*diff)[size_t(ib * classes + c)] -= w;
  }

  void resolve() {
    std::vector<float> run(size_t(classes), 0.f);
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < classes; ++c) {
        run[size_t(c)] += (*diff)[size_t(x * classes + c)];
        (*share)[size_t(x * classes + c)] += run[size_t(c)];
      }
  }
};

// Emits the state segments of token t: (step_begin, step_end, class).
template <typename Emit>
void token_segments(const HeadTimeline& h, int64_t t, const TimelineClasses& cls, Emit emit) {
  const int64_t end = h.n_steps;
  int32_t fed = h.fed_step[size_t(t)];
  int32_t admit = h.lifetimes.admit_step[size_t(t)];
  int32_t evict = h.lifetimes.evict_step[size_t(t)];
  if (admit < 0) {
    emit(fed, end, cls.rejected());
    return;
  }
  int32_t gone = evict < 0 ? int32_t(end) : evict;
  int64_t first = h.interval_begin[size_t(t)], last = h.interval_begin[size_t(t) + 1];
  if (first == last) {
    emit(admit, gone, 0);
  } else {
    for (int64_t i = first; i < last; ++i) {
      const trace::TierInterval& iv = h.intervals[size_t(i)];
      emit(iv.begin_step, iv.end_step < 0 ? gone : iv.end_step,
           std::min<int>(iv.tier, int(cls.tiers) - 1));
    }
  }
  if (evict >= 0) emit(evict, end, cls.evicted());
}

}  // namespace

void fold_timeline_rows(const HeadTimeline& h, double step_begin, double step_end,
                        double token_begin, double token_end, int width, int height,
                        const TimelineRowSink& emit) {
  const int W = std::max(1, width), H = std::max(1, height);
  const TimelineClasses classes{std::max<int64_t>(1, h.n_tiers)};
  const int C = classes.count();
  const double steps_per_px = std::max(1e-9, (step_end - step_begin) / W);
  const double tokens_per_px = std::max(1e-9, (token_end - token_begin) / H);
  const int64_t t0 = std::max<int64_t>(0, int64_t(std::floor(token_begin)));
  const int64_t t1 = std::min<int64_t>(h.n_tokens(), int64_t(std::ceil(token_end)));
  std::vector<float> row(size_t(W) * size_t(C)), diff(size_t(W + 1) * size_t(C)), full;
  int current = -1;
  RowAccumulator acc{W, C, &row, &diff};
  auto start_row = [&](int y) {
    current = y;
    std::fill(row.begin(), row.end(), 0.f);
    std::fill(diff.begin(), diff.end(), 0.f);
  };
  auto finish_row = [&] {
    if (current < 0) return;
    acc.resolve();
    emit(current, row.data());
    current = -1;
  };
  auto add_token = [&](int64_t t, float w) {
    token_segments(h, t, classes, [&](double a, double b, int c) {
      acc.add((a - step_begin) / steps_per_px, (b - step_begin) / steps_per_px, c, w);
    });
  };
  // Tokens map to rows in order, so each row is filled, finished and emitted
  // once: one row buffer, no tokens x steps work, no full-size raster.
  for (int64_t t = t0; t < t1; ++t) {
    double ya = (double(t) - token_begin) / tokens_per_px;
    double yb = (double(t + 1) - token_begin) / tokens_per_px;
    int y_first = std::max(0, int(std::floor(ya)));
    int y_last = std::min(H - 1, int(std::ceil(yb)) - 1);
    bool have_full = false;
    for (int y = y_first; y <= y_last; ++y) {
      float w = float(std::min(yb, double(y + 1)) - std::max(ya, double(y)));
      if (w <= 0) continue;
      if (w >= 1.f) {
        // Zoomed in, a token fills many rows: they are all the same row.
        if (have_full) {
          emit(y, full.data());
          continue;
        }
        finish_row();
        start_row(y);
        add_token(t, 1.f);
        acc.resolve();
        full = row;
        have_full = true;
        emit(y, row.data());
        current = -1;
        continue;
      }
      if (y != current) {
        finish_row();
        start_row(y);
      }
      add_token(t, w);
    }
  }
  finish_row();
}

TimelineRaster fold_timeline(const HeadTimeline& h, double step_begin, double step_end,
                             double token_begin, double token_end, int width, int height) {
  TimelineRaster r;
  r.width = std::max(1, width);
  r.height = std::max(1, height);
  r.classes.tiers = std::max<int64_t>(1, h.n_tiers);
  const size_t row_floats = size_t(r.width) * size_t(r.classes.count());
  r.share.assign(row_floats * size_t(r.height), 0.f);
  fold_timeline_rows(
      h, step_begin, step_end, token_begin, token_end, width, height, [&](int y, const float* row) {
        std::copy(row, row + row_floats, r.share.begin() + long(y) * long(row_floats));
      });
  return r;
}

}  // namespace kvscope::analysis
