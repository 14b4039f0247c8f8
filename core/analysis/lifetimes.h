// Who held which token when: lifetimes of many heads at once, the per-layer
// count of heads holding each token (seed 003, fig. 6) and the folded
// tokens x steps raster of the eviction timeline.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/trace/reader.h"

namespace kvscope::analysis {

// A token is held by a head during step s (the step's queries can attend it)
// when it was admitted at or before s and not evicted at or before s.
inline bool held_at(int32_t admit, int32_t evict, int64_t step) {
  return admit >= 0 && admit <= step && (evict < 0 || evict > step);
}

// Lifetimes of every (layer, kv head) for tokens [token_begin, token_end).
struct AllLifetimes {
  int64_t layers = 0, kv_heads = 0, token_begin = 0, token_end = 0;
  std::vector<int32_t> admit, evict;  // ((l * K + k) * n + (t - token_begin))

  static AllLifetimes read(const trace::TraceReader& reader, int64_t token_begin = 0,
                           int64_t token_end = -1);
  int64_t n_tokens() const { return token_end - token_begin; }
  size_t index(int64_t layer, int64_t kv_head, int64_t token) const {
    return size_t((layer * kv_heads + kv_head) * n_tokens() + (token - token_begin));
  }
  bool held(int64_t layer, int64_t kv_head, int64_t token, int64_t step) const {
    size_t i = index(layer, kv_head, token);
    return held_at(admit[i], evict[i], step);
  }
  // Heads of `layer` holding `token` during `step`.
  int heads_holding(int64_t layer, int64_t token, int64_t step) const;
  // Entries every head holds during `step` (L*K).
  std::vector<int32_t> held_counts(int64_t step) const;
};

// Per layer, the number of kv heads holding each token during `step`:
// layers x n_tokens, row-major.
std::vector<uint16_t> layer_head_counts(const AllLifetimes& all, int64_t step);

// One head's timeline: lifetimes, the step that fed each token, tier moves.
struct HeadTimeline {
  int layer = 0, kv_head = 0;
  int64_t n_steps = 0, n_tiers = 1;
  trace::HeadLifetimes lifetimes;              // tokens [0, n_tokens)
  std::vector<int32_t> fed_step;               // step that fed token t
  std::vector<trace::TierInterval> intervals;  // sorted by token (tiered traces)
  std::vector<int64_t> interval_begin;         // per token: first interval row; size n_tokens + 1

  static HeadTimeline read(const trace::TraceReader& reader, int layer, int kv_head);
  int64_t n_tokens() const { return static_cast<int64_t>(fed_step.size()); }
};

// State classes of a timeline cell: held in tier r (0..R-1), then these.
struct TimelineClasses {
  int64_t tiers = 1;
  int evicted() const { return static_cast<int>(tiers); }
  int rejected() const { return static_cast<int>(tiers) + 1; }  // fed but never admitted
  int count() const { return static_cast<int>(tiers) + 2; }
};

// The timeline folded to pixels: cell (x, y) holds, per state class, the
// share of the pixel's token x step area in that state (0..1; the rest is
// "not fed yet"). Steps run along x, tokens along y. Cost is O(tokens in the
// window + pixels x classes), never tokens x steps.
struct TimelineRaster {
  int width = 0, height = 0;
  TimelineClasses classes;
  std::vector<float> share;  // ((y * width) + x) * classes.count() + c
  float at(int x, int y, int c) const {
    return share[size_t((int64_t(y) * width + x) * classes.count() + c)];
  }
};

TimelineRaster fold_timeline(const HeadTimeline& head, double step_begin, double step_end,
                             double token_begin, double token_end, int width, int height);

// The same fold, row by row: `emit(y, shares)` gets each pixel row that any
// token touches (width * classes shares), in increasing y. Paints use this
// to write scanlines directly.
using TimelineRowSink = std::function<void(int y, const float* shares)>;
void fold_timeline_rows(const HeadTimeline& head, double step_begin, double step_end,
                        double token_begin, double token_end, int width, int height,
                        const TimelineRowSink& emit);

}  // namespace kvscope::analysis
