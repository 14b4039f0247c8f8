// Level-of-detail pyramid of the pooled attention maps, built once per trace
// and kept in a cache file beside it (Perfetto/Tracy style mipmaps).
//
// Level 0 is /attention/pooled itself (query blocks x key blocks per layer and
// query head), read through the TraceReader in chunk-aligned tiles. Level n
// halves both axes of level n-1: max of the children's max, mean of the
// children's means. Levels >= 2 live in the cache, memory-mapped, so a view
// zoomed out over a huge map reads a few thousand cells instead of the whole
// dataset, and the overview grid gets every head's thumbnail without touching
// the trace. The cache also stores per-head metrics for sorting the overview.
//
// Cache format (little-endian, version kLodCacheVersion): a fixed header
// naming the trace (size and mtime, so an edited trace invalidates it) and its
// shape, then per level, per stat (max, mean), per (layer, head) a row-major
// float16 grid, then L*H*kMetricCount float32 metrics. The file is written to
// a temporary name and renamed, so a crash never leaves a half cache that
// passes for a whole one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/trace/reader.h"

namespace kvscope::analysis {

// 2: level 1 no longer stored (first_level in the header).
inline constexpr uint32_t kLodCacheVersion = 2;
// The finest level the cache stores: level 1 holds a quarter of level 0's
// cells, three quarters of a cache that stored it (769 MB beside a 1.4 GB
// trace); levels from 2 hold at most 1/12 of level 0's cells. Level 1 views
// read their window from the trace and halve it.
inline constexpr int kFirstCachedLevel = 2;

// Per-head summaries of the mean attention map, for sorting heads.
enum class HeadMetric : int {
  SinkMass = 0,   // share of each query row's mass on the first key block
  LocalMass = 1,  // share on the diagonal block and the one before it
  Entropy = 2,    // mean row entropy over key blocks, normalised to [0, 1]
};
inline constexpr int kMetricCount = 3;
const char* head_metric_name(HeadMetric metric);

// A rectangular window of one level of one head's map: rows are query cells,
// columns key cells; a cell of level n covers 2^n pooled blocks per axis.
struct AttentionGrid {
  int level = 0;
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;  // in cells of this level
  int64_t cell_tokens = 0;       // tokens per cell edge: pooled_block << level
  std::vector<float> max, mean;  // (row_end - row_begin) x (col_end - col_begin)
  int64_t rows() const { return row_end - row_begin; }
  int64_t cols() const { return col_end - col_begin; }
};

// The overview's thumbnails: the coarsest cached level whose longer side is
// still at least this many cells.
inline constexpr int64_t kThumbnailSide = 24;

class AttentionLod {
 public:
  using Progress = std::function<void(int64_t done, int64_t total)>;
  // Called as each head is done during a build, with its thumbnail (the
  // level level_for_side(kThumbnailSide) picks once the cache is open) and
  // its kMetricCount metrics: views can show heads before the cache is done.
  using HeadDone = std::function<void(int layer, int head, const AttentionGrid& thumbnail,
                                      const std::vector<float>& metrics)>;

  // "<trace>.lod" beside the trace, or under $XDG_CACHE_HOME/kvscope (else
  // ~/.cache/kvscope) when the trace's directory is not writable.
  static std::string default_cache_path(const std::string& trace_path);

  // Opens a valid cache for this reader's trace, or returns null when there
  // is none or it is stale (other trace size, mtime, shape or version).
  static std::unique_ptr<AttentionLod> open(const trace::TraceReader& reader,
                                            const std::string& cache_path);
  // Builds the cache (reading every pooled tile once) and opens it. Only for
  // complete traces: a live trace still rewrites its last query block.
  // `cancel` set to true stops the build (returns null, writes nothing).
  static std::unique_ptr<AttentionLod> build(const trace::TraceReader& reader,
                                             const std::string& cache_path,
                                             const Progress& progress = {},
                                             const std::atomic<bool>* cancel = nullptr,
                                             const HeadDone& head_done = {});
  static std::unique_ptr<AttentionLod> open_or_build(const trace::TraceReader& reader,
                                                     const std::string& cache_path,
                                                     const Progress& progress = {},
                                                     const std::atomic<bool>* cancel = nullptr,
                                                     const HeadDone& head_done = {});
  ~AttentionLod();
  AttentionLod(const AttentionLod&) = delete;
  AttentionLod& operator=(const AttentionLod&) = delete;

  const std::string& path() const;
  int64_t layers() const;
  int64_t heads() const;
  int64_t pooled_block() const;
  int n_levels() const;     // levels 1..n_levels() exist
  int first_level() const;  // levels first_level()..n_levels() are in the cache
  int64_t level_rows(int level) const;
  int64_t level_cols(int level) const;
  // Window of a cached level (first_level()..n_levels()); clipped to the level.
  AttentionGrid window(int layer, int head, int level, int64_t row_begin, int64_t row_end,
                       int64_t col_begin, int64_t col_end) const;
  AttentionGrid whole(int layer, int head, int level) const;
  // Coarsest level whose longer side is still >= min_side (or first_level()).
  int level_for_side(int64_t min_side) const;
  float metric(int layer, int head, HeadMetric metric) const;

 private:
  struct Impl;
  explicit AttentionLod(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Level-0 window read from the trace itself (chunk-aligned tile reads).
AttentionGrid read_level0(const trace::TraceReader& reader, int layer, int head, int64_t row_begin,
                          int64_t row_end, int64_t col_begin, int64_t col_end);

// Halves a grid (max of max, mean of means over the children present).
AttentionGrid downsample(const AttentionGrid& grid);

// Chooses the level for showing `rows x cols` level-0 cells in about
// `pixels_w x pixels_h` pixels: the finest level with at most ~1 cell per
// pixel, so cost follows pixels, not data.
int level_for_pixels(int64_t rows, int64_t cols, double pixels_w, double pixels_h);

// The map of one head for a viewport [row_begin,row_end) x [col_begin,col_end)
// in level-0 cells, at the level that fits the pixels: from the cache when
// the level is cached, else read at level 0 and downsampled (live traces, or
// no cache). Never reads more than the viewport at the chosen level needs,
// except when it must fall back to level 0 without a cache.
AttentionGrid attention_view(const trace::TraceReader& reader, const AttentionLod* lod, int layer,
                             int head, int64_t row_begin, int64_t row_end, int64_t col_begin,
                             int64_t col_end, double pixels_w, double pixels_h);

// The same for a dense head (/attention/dense: full rows of one query head):
// cells are tokens at level 0; rows are read in bands and pooled on the fly
// (dense heads are few and chosen, so no cache). max and mean of a level-0
// cell are both the attention weight.
AttentionGrid dense_view(const trace::TraceReader& reader, int dense_index, int64_t row_begin,
                         int64_t row_end, int64_t col_begin, int64_t col_end, double pixels_w,
                         double pixels_h);
// Index of (layer, query head) among the dense heads, or -1.
int dense_index_of(const trace::TraceReader& reader, int layer, int head);

// Per-head metrics of a mean map (rows are queries, causal lower triangle).
std::vector<float> head_metrics(const AttentionGrid& level0_mean_grid);

}  // namespace kvscope::analysis
