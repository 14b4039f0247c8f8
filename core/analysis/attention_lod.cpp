#include "core/analysis/attention_lod.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <climits>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/trace/error.h"
#include "core/trace/half.h"

namespace kvscope::analysis {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'L', 'O', 'D', '\0', '\0'};
constexpr int kMaxLevels = 32;
// Levels stop once the longer side is at most this: a thumbnail.
constexpr int64_t kSmallestSide = 8;
// Query blocks read per band while building: one chunk row of the dataset.
constexpr int64_t kBandRows = 64;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t n_levels;
  uint32_t first_level;  // the finest level stored (kFirstCachedLevel, or 1 for tiny maps)
  uint32_t reserved;
  int64_t trace_bytes;
  int64_t trace_mtime_ns;
  int64_t layers, heads, pooled_block, rows0, cols0;
  int64_t level_rows[kMaxLevels];
  int64_t level_cols[kMaxLevels];
  int64_t level_offset[kMaxLevels];  // byte offset of level (index level-1)
  int64_t metrics_offset;
  int64_t total_bytes;
};

struct TraceStamp {
  int64_t bytes = -1, mtime_ns = -1;
};

TraceStamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

Header plan(const trace::TraceReader& r) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kLodCacheVersion;
  TraceStamp s = stamp_of(r.path());
  h.trace_bytes = s.bytes;
  h.trace_mtime_ns = s.mtime_ns;
  h.layers = r.n_layers();
  h.heads = r.n_heads();
  h.pooled_block = r.layout().pooled_block;
  h.rows0 = r.pooled_query_blocks();
  h.cols0 = r.pooled_key_blocks();
  int64_t rows = h.rows0, cols = h.cols0;
  int64_t offset = static_cast<int64_t>(sizeof(Header));
  int n = 0;
  while (std::max(rows, cols) > kSmallestSide && n < kMaxLevels) {
    rows = (rows + 1) / 2;
    cols = (cols + 1) / 2;
    h.level_rows[n] = rows;
    h.level_cols[n] = cols;
    ++n;
  }
  h.n_levels = static_cast<uint32_t>(n);
  // Level 1 alone would be three quarters of the cache (a quarter of level
  // 0's cells): it is read from the trace and halved per viewport instead,
  // unless it is the only level.
  h.first_level = n >= kFirstCachedLevel ? uint32_t(kFirstCachedLevel) : 1;
  for (int i = 0; i < n; ++i) {
    if (i + 1 < int(h.first_level)) {
      h.level_offset[i] = -1;
      continue;
    }
    h.level_offset[i] = offset;
    offset += 2 * h.layers * h.heads * h.level_rows[i] * h.level_cols[i] * 2;  // max, mean in f16
  }
  h.metrics_offset = offset;
  h.total_bytes = offset + h.layers * h.heads * kMetricCount * 4;
  return h;
}

// Coarsest stored level whose longer side is still >= min_side (else the
// finest stored one; 0 when nothing is stored).
int level_for_side(const Header& h, int64_t min_side) {
  const int n = int(h.n_levels), first = int(h.first_level);
  int best = n > 0 ? first : 0;
  for (int level = first; level <= n; ++level)
    if (std::max(h.level_rows[level - 1], h.level_cols[level - 1]) >= min_side) best = level;
  return best;
}

bool same_shape(const Header& a, const Header& b) {
  return std::memcmp(a.magic, b.magic, 8) == 0 && a.version == b.version &&
         a.n_levels == b.n_levels && a.first_level == b.first_level &&
         a.trace_bytes == b.trace_bytes && a.trace_mtime_ns == b.trace_mtime_ns &&
         a.layers == b.layers && a.heads == b.heads && a.pooled_block == b.pooled_block &&
         a.rows0 == b.rows0 && a.cols0 == b.cols0 && a.total_bytes == b.total_bytes;
}

[[noreturn]] void io_fail(const std::string& path, const std::string& what) {
  throw trace::TraceError(trace::ErrorCode::Io, path, "", what + ": " + std::strerror(errno));
}

bool dir_writable(const std::string& file) {
  size_t slash = file.rfind('/');
  std::string dir = slash == std::string::npos ? "." : file.substr(0, std::max<size_t>(slash, 1));
  return ::access(dir.c_str(), W_OK) == 0;
}

}  // namespace

const char* head_metric_name(HeadMetric metric) {
  switch (metric) {
    case HeadMetric::SinkMass: return "sink mass";
    case HeadMetric::LocalMass: return "local mass";
    case HeadMetric::Entropy: return "entropy";
  }
  return "?";
}

struct AttentionLod::Impl {
  std::string path;
  Header header{};
  const uint8_t* base = nullptr;
  size_t size = 0;

  ~Impl() {
    if (base) ::munmap(const_cast<uint8_t*>(base), size);
  }

  const uint16_t* grid(int level, int stat, int layer, int head) const {
    int64_t rows = header.level_rows[level - 1], cols = header.level_cols[level - 1];
    int64_t index = (int64_t(stat) * header.layers + layer) * header.heads + head;
    return reinterpret_cast<const uint16_t*>(base + header.level_offset[level - 1] +
                                             index * rows * cols * 2);
  }
};

AttentionLod::AttentionLod(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AttentionLod::~AttentionLod() = default;

std::string AttentionLod::default_cache_path(const std::string& trace_path) {
  std::string beside = trace_path + ".lod";
  if (dir_writable(trace_path)) return beside;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string dir = xdg && *xdg ? std::string(xdg) + "/kvscope"
                                : std::string(home ? home : "/tmp") + "/.cache/kvscope";
  ::mkdir((dir.substr(0, dir.rfind('/'))).c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  char resolved[PATH_MAX];
  std::string key = ::realpath(trace_path.c_str(), resolved) ? resolved : trace_path;
  return dir + "/" + std::to_string(std::hash<std::string>{}(key)) + ".lod";
}

std::unique_ptr<AttentionLod> AttentionLod::open(const trace::TraceReader& reader,
                                                 const std::string& cache_path) {
  if (reader.layout().pooled_block <= 0 || !reader.complete()) return nullptr;
  int fd = ::open(cache_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  Header want = plan(reader);
  if (::fstat(fd, &st) != 0 || st.st_size != want.total_bytes) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->path = cache_path;
  impl->base = static_cast<const uint8_t*>(p);
  impl->size = size_t(st.st_size);
  std::memcpy(&impl->header, p, sizeof(Header));
  if (!same_shape(impl->header, want)) return nullptr;
  return std::unique_ptr<AttentionLod>(new AttentionLod(std::move(impl)));
}

namespace {

// Accumulates per-row metrics of level-0 mean rows, band by band.
struct MetricSums {
  double sink = 0, local = 0, entropy = 0;
  int64_t rows = 0, entropy_rows = 0;

  void add_row(const float* mean, int64_t q, int64_t cols) {
    int64_t last = std::min(q, cols - 1);
    double total = 0;
    for (int64_t k = 0; k <= last; ++k) total += mean[k];
    if (!(total > 0)) return;
    sink += mean[0] / total;
    local += (mean[last] + (last > 0 ? mean[last - 1] : 0.0)) / total;
    ++rows;
    if (last >= 1) {
      double h = 0;
      for (int64_t k = 0; k <= last; ++k) {
        double p = mean[k] / total;
        if (p > 0) h -= p * std::log(p);
      }
      entropy += h / std::log(double(last + 1));
      ++entropy_rows;
    }
  }
  std::vector<float> values() const {
    return {rows ? float(sink / rows) : 0.f, rows ? float(local / rows) : 0.f,
            entropy_rows ? float(entropy / entropy_rows) : 0.f};
  }
};

void store_half(const std::vector<float>& src, std::vector<uint16_t>* dst) {
  dst->resize(src.size());
  for (size_t i = 0; i < src.size(); ++i) (*dst)[i] = trace::float_to_half(src[i]);
}

void pwrite_all(int fd, const void* data, size_t bytes, int64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, bytes, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail(path, "cannot write the level-of-detail cache");
    }
    p += n;
    bytes -= size_t(n);
    offset += n;
  }
}

// Level 1 of one head, built from level-0 bands; also the head's metrics.
AttentionGrid build_level1(const trace::TraceReader& r, int layer, int head, const Header& h,
                           std::vector<float>* metrics) {
  AttentionGrid level1;
  level1.level = 1;
  level1.row_end = h.level_rows[0];
  level1.col_end = h.level_cols[0];
  level1.cell_tokens = h.pooled_block * 2;
  level1.max.assign(size_t(level1.rows() * level1.cols()), 0.f);
  level1.mean.assign(level1.max.size(), 0.f);
  MetricSums sums;
  for (int64_t q0 = 0; q0 < h.rows0; q0 += kBandRows) {
    int64_t q1 = std::min(h.rows0, q0 + kBandRows);
    AttentionGrid band = read_level0(r, layer, head, q0, q1, 0, h.cols0);
    for (int64_t q = q0; q < q1; ++q)
      sums.add_row(band.mean.data() + (q - q0) * h.cols0, q, h.cols0);
    AttentionGrid half = downsample(band);
    std::copy(half.max.begin(), half.max.end(), level1.max.begin() + (q0 / 2) * level1.cols());
    std::copy(half.mean.begin(), half.mean.end(), level1.mean.begin() + (q0 / 2) * level1.cols());
  }
  *metrics = sums.values();
  return level1;
}

}  // namespace

std::unique_ptr<AttentionLod> AttentionLod::build(const trace::TraceReader& reader,
                                                  const std::string& cache_path,
                                                  const Progress& progress,
                                                  const std::atomic<bool>* cancel,
                                                  const HeadDone& head_done) {
  if (reader.layout().pooled_block <= 0)
    throw trace::TraceError(trace::ErrorCode::Usage, reader.path(), "/attention/pooled",
                            "not captured: no attention map to build levels of detail from");
  if (!reader.complete())
    throw trace::TraceError(trace::ErrorCode::Usage, reader.path(), "/run/complete",
                            "the trace is still being written; levels of detail are built once "
                            "it is complete");
  Header h = plan(reader);
  const int thumbnail_level = analysis::level_for_side(h, kThumbnailSide);
  std::string tmp = cache_path + ".tmp" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(tmp, "cannot create the level-of-detail cache");
  auto fail_cleanup = [&] {
    ::close(fd);
    ::unlink(tmp.c_str());
  };
  try {
    if (::ftruncate(fd, h.total_bytes) != 0) io_fail(tmp, "cannot size the cache");
    pwrite_all(fd, &h, sizeof(Header), 0, tmp);
    std::vector<float> metrics(size_t(h.layers * h.heads * kMetricCount));
    std::vector<uint16_t> half;
    const int64_t total = h.layers * h.heads;
    for (int layer = 0; layer < h.layers; ++layer) {
      for (int head = 0; head < h.heads; ++head) {
        if (cancel && cancel->load()) {
          fail_cleanup();
          return nullptr;
        }
        std::vector<float> m;
        AttentionGrid grid =
            h.n_levels > 0 ? build_level1(reader, layer, head, h, &m) : AttentionGrid{};
        if (h.n_levels == 0) {
          AttentionGrid all = read_level0(reader, layer, head, 0, h.rows0, 0, h.cols0);
          MetricSums sums;
          for (int64_t q = 0; q < h.rows0; ++q)
            sums.add_row(all.mean.data() + q * h.cols0, q, h.cols0);
          m = sums.values();
        }
        std::copy(m.begin(), m.end(), metrics.begin() + (layer * h.heads + head) * kMetricCount);
        for (uint32_t level = 1; level <= h.n_levels; ++level) {
          if (level > 1) grid = downsample(grid);
          if (head_done && int(level) == thumbnail_level) head_done(layer, head, grid, m);
          if (level < h.first_level) continue;  // not stored
          int64_t cells = h.level_rows[level - 1] * h.level_cols[level - 1];
          for (int stat = 0; stat < 2; ++stat) {
            store_half(stat == 0 ? grid.max : grid.mean, &half);
            int64_t index = (int64_t(stat) * h.layers + layer) * h.heads + head;
            pwrite_all(fd, half.data(), half.size() * 2,
                       h.level_offset[level - 1] + index * cells * 2, tmp);
          }
        }
        if (progress) progress(layer * h.heads + head + 1, total);
      }
    }
    pwrite_all(fd, metrics.data(), metrics.size() * 4, h.metrics_offset, tmp);
    if (::fsync(fd) != 0) io_fail(tmp, "cannot flush the cache");
  } catch (...) {
    fail_cleanup();
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), cache_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    io_fail(cache_path, "cannot move the finished cache into place");
  }
  auto lod = open(reader, cache_path);
  if (!lod)
    throw trace::TraceError(trace::ErrorCode::Io, cache_path, "",
                            "the cache just written does not read back as valid");
  return lod;
}

std::unique_ptr<AttentionLod> AttentionLod::open_or_build(const trace::TraceReader& reader,
                                                          const std::string& cache_path,
                                                          const Progress& progress,
                                                          const std::atomic<bool>* cancel,
                                                          const HeadDone& head_done) {
  if (auto lod = open(reader, cache_path)) return lod;
  return build(reader, cache_path, progress, cancel, head_done);
}

const std::string& AttentionLod::path() const {
  return impl_->path;
}
int64_t AttentionLod::layers() const {
  return impl_->header.layers;
}
int64_t AttentionLod::heads() const {
  return impl_->header.heads;
}
int64_t AttentionLod::pooled_block() const {
  return impl_->header.pooled_block;
}
int AttentionLod::n_levels() const {
  return static_cast<int>(impl_->header.n_levels);
}
int64_t AttentionLod::level_rows(int level) const {
  return level == 0 ? impl_->header.rows0 : impl_->header.level_rows[level - 1];
}
int64_t AttentionLod::level_cols(int level) const {
  return level == 0 ? impl_->header.cols0 : impl_->header.level_cols[level - 1];
}

AttentionGrid AttentionLod::window(int layer, int head, int level, int64_t row_begin,
                                   int64_t row_end, int64_t col_begin, int64_t col_end) const {
  const Header& h = impl_->header;
  if (level < first_level() || level > n_levels() || layer < 0 || layer >= h.layers || head < 0 ||
      head >= h.heads)
    throw trace::TraceError(trace::ErrorCode::Usage, impl_->path, "level",
                            "level " + std::to_string(level) + " of head (" +
                                std::to_string(layer) + ", " + std::to_string(head) +
                                ") is not in the cache");
  int64_t rows = level_rows(level), cols = level_cols(level);
  AttentionGrid g;
  g.level = level;
  g.row_begin = std::clamp<int64_t>(row_begin, 0, rows);
  g.row_end = std::clamp<int64_t>(row_end, g.row_begin, rows);
  g.col_begin = std::clamp<int64_t>(col_begin, 0, cols);
  g.col_end = std::clamp<int64_t>(col_end, g.col_begin, cols);
  g.cell_tokens = h.pooled_block << level;
  for (int stat = 0; stat < 2; ++stat) {
    const uint16_t* src = impl_->grid(level, stat, layer, head);
    std::vector<float>& out = stat == 0 ? g.max : g.mean;
    out.resize(size_t(g.rows() * g.cols()));
    float* dst = out.data();
    for (int64_t r = g.row_begin; r < g.row_end; ++r)
      for (int64_t c = g.col_begin; c < g.col_end; ++c)
        *dst++ = trace::half_to_float(src[r * cols + c]);
  }
  return g;
}

AttentionGrid AttentionLod::whole(int layer, int head, int level) const {
  return window(layer, head, level, 0, level_rows(level), 0, level_cols(level));
}

int AttentionLod::first_level() const {
  return static_cast<int>(impl_->header.first_level);
}

int AttentionLod::level_for_side(int64_t min_side) const {
  return analysis::level_for_side(impl_->header, min_side);
}

float AttentionLod::metric(int layer, int head, HeadMetric metric) const {
  const Header& h = impl_->header;
  const float* m = reinterpret_cast<const float*>(impl_->base + h.metrics_offset);
  return m[(layer * h.heads + head) * kMetricCount + static_cast<int>(metric)];
}

AttentionGrid read_level0(const trace::TraceReader& reader, int layer, int head, int64_t row_begin,
                          int64_t row_end, int64_t col_begin, int64_t col_end) {
  int64_t rows = reader.pooled_query_blocks(), cols = reader.pooled_key_blocks();
  AttentionGrid g;
  g.level = 0;
  g.row_begin = std::clamp<int64_t>(row_begin, 0, rows);
  g.row_end = std::clamp<int64_t>(row_end, g.row_begin, rows);
  g.col_begin = std::clamp<int64_t>(col_begin, 0, cols);
  g.col_end = std::clamp<int64_t>(col_end, g.col_begin, cols);
  g.cell_tokens = reader.layout().pooled_block;
  if (g.rows() == 0 || g.cols() == 0) return g;
  trace::PooledTile tile =
      reader.pooled(layer, head, g.row_begin, g.row_end, g.col_begin, g.col_end);
  g.max = std::move(tile.max);
  g.mean = std::move(tile.mean);
  return g;
}

AttentionGrid downsample(const AttentionGrid& in) {
  AttentionGrid out;
  out.level = in.level + 1;
  out.cell_tokens = in.cell_tokens * 2;
  // Cells of the next level covering this window (the window need not be even-aligned).
  out.row_begin = in.row_begin / 2;
  out.row_end = (in.row_end + 1) / 2;
  out.col_begin = in.col_begin / 2;
  out.col_end = (in.col_end + 1) / 2;
  int64_t R = out.rows(), C = out.cols(), ic = in.cols();
  out.max.assign(size_t(R * C), 0.f);
  out.mean.assign(size_t(R * C), 0.f);
  std::vector<float> count(size_t(R * C), 0.f);
  for (int64_t r = in.row_begin; r < in.row_end; ++r) {
    const float* mx = in.max.data() + (r - in.row_begin) * ic;
    const float* mn = in.mean.data() + (r - in.row_begin) * ic;
    size_t orow = size_t((r / 2 - out.row_begin) * C);
    for (int64_t c = in.col_begin; c < in.col_end; ++c) {
      size_t o = orow + size_t(c / 2 - out.col_begin);
      int64_t i = c - in.col_begin;
      out.max[o] = std::max(out.max[o], mx[i]);
      out.mean[o] += mn[i];
      count[o] += 1.f;
    }
  }
  for (size_t i = 0; i < out.mean.size(); ++i)
    if (count[i] > 0) out.mean[i] /= count[i];
  return out;
}

int level_for_pixels(int64_t rows, int64_t cols, double pixels_w, double pixels_h) {
  double ratio =
      std::max(double(rows) / std::max(1.0, pixels_h), double(cols) / std::max(1.0, pixels_w));
  int level = 0;
  while (ratio > 1.0 && level < kMaxLevels) {
    ratio /= 2;
    ++level;
  }
  return level;
}

AttentionGrid attention_view(const trace::TraceReader& reader, const AttentionLod* lod, int layer,
                             int head, int64_t row_begin, int64_t row_end, int64_t col_begin,
                             int64_t col_end, double pixels_w, double pixels_h) {
  int level = level_for_pixels(row_end - row_begin, col_end - col_begin, pixels_w, pixels_h);
  if (lod && level >= 1) {
    level = std::min(level, lod->n_levels());
    if (level >= lod->first_level()) {
      int64_t r0 = row_begin >> level, r1 = (row_end + (int64_t(1) << level) - 1) >> level;
      int64_t c0 = col_begin >> level, c1 = (col_end + (int64_t(1) << level) - 1) >> level;
      return lod->window(layer, head, level, r0, r1, c0, c1);
    }
  }
  // No cache (live trace) or level 0: read the aligned window and pool it here.
  int64_t align = int64_t(1) << level;
  AttentionGrid g = read_level0(reader, layer, head, row_begin / align * align,
                                (row_end + align - 1) / align * align, col_begin / align * align,
                                (col_end + align - 1) / align * align);
  for (int i = 0; i < level; ++i) g = downsample(g);
  return g;
}

int dense_index_of(const trace::TraceReader& reader, int layer, int head) {
  const auto& heads = reader.layout().dense_heads;
  for (size_t i = 0; i < heads.size(); ++i)
    if (heads[i].first == layer && heads[i].second == head) return int(i);
  return -1;
}

AttentionGrid dense_view(const trace::TraceReader& reader, int dense_index, int64_t row_begin,
                         int64_t row_end, int64_t col_begin, int64_t col_end, double pixels_w,
                         double pixels_h) {
  const int64_t T = reader.n_tokens(), M = reader.layout().max_tokens;
  row_begin = std::clamp<int64_t>(row_begin, 0, T);
  row_end = std::clamp<int64_t>(row_end, row_begin, T);
  col_begin = std::clamp<int64_t>(col_begin, 0, M);
  col_end = std::clamp<int64_t>(col_end, col_begin, M);
  int level = level_for_pixels(row_end - row_begin, col_end - col_begin, pixels_w, pixels_h);
  const int64_t align = int64_t(1) << level;
  row_begin = row_begin / align * align;
  col_begin = col_begin / align * align;
  col_end = std::min(M, (col_end + align - 1) / align * align);
  AttentionGrid out;
  bool first = true;
  // Bands of whole rows (a multiple of 2^level so that bands pool exactly).
  const int64_t band = std::max<int64_t>(64, align);
  for (int64_t q0 = row_begin; q0 < row_end; q0 += band) {
    int64_t q1 = std::min(row_end, q0 + band);
    std::vector<float> rows = reader.dense_rows(dense_index, q0, q1);
    AttentionGrid g;
    g.row_begin = q0;
    g.row_end = q1;
    g.col_begin = col_begin;
    g.col_end = col_end;
    g.cell_tokens = 1;
    g.max.resize(size_t((q1 - q0) * g.cols()));
    for (int64_t r = 0; r < q1 - q0; ++r)
      std::copy(rows.begin() + r * M + col_begin, rows.begin() + r * M + col_end,
                g.max.begin() + r * g.cols());
    g.mean = g.max;
    for (int i = 0; i < level; ++i) g = downsample(g);
    if (first) {
      out = std::move(g);
      first = false;
    } else {
      out.row_end = g.row_end;
      out.max.insert(out.max.end(), g.max.begin(), g.max.end());
      out.mean.insert(out.mean.end(), g.mean.begin(), g.mean.end());
    }
  }
  if (first) {
    out.level = level;
    out.cell_tokens = align;
    out.row_begin = out.row_end = row_begin >> level;
    out.col_begin = col_begin >> level;
    out.col_end = col_end >> level;
  }
  return out;
}

std::vector<float> head_metrics(const AttentionGrid& g) {
  MetricSums sums;
  for (int64_t q = g.row_begin; q < g.row_end; ++q)
    sums.add_row(g.mean.data() + (q - g.row_begin) * g.cols(), q, g.cols());
  return sums.values();
}

}  // namespace kvscope::analysis
