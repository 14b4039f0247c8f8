#include "core/trace/reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <map>
#include <type_traits>

#include "core/common/check.h"
#include "core/trace/error.h"
#include "core/trace/h5.h"
#include "core/trace/half.h"
#include "core/trace/open.h"
#include "core/trace/row_tables.h"
#include "core/trace/schema.h"

namespace kvscope::trace {

namespace {

const char* kStepColumns[] = {"/steps/kind",      "/steps/first_token", "/steps/n_tokens",
                              "/steps/t_start_s", "/steps/wall_s",      "/steps/entries",
                              "/steps/kv_bytes",  "/steps/event_begin", "/steps/event_count"};
const char* kTokenColumns[] = {"/tokens/id",           "/tokens/position",   "/tokens/role",
                               "/tokens/step",         "/tokens/text_begin", "/tokens/text_len",
                               "/tokens/prompt_offset"};
// The datasets of a row table's columns.
std::vector<std::string> column_paths(const RowTableSpec& t) {
  std::vector<std::string> paths;
  for (const ColumnSpec& c : t.columns) paths.push_back(t.path(c));
  return paths;
}

// A step table's step column once read (the committed rows).
struct StepRows {
  std::vector<int32_t> steps;
  bool read = false;
};

}  // namespace

struct TraceReader::Impl {
  std::string path;
  OpenedTrace opened;
  RunInfo run;
  CaptureLayout layout;
  std::map<std::string, h5::Handle> open_datasets;
  std::map<std::string, Elem> expected_elem;  // from the schema
  bool complete = false;
  int64_t n_steps = 0, n_tokens = 0, n_events = 0;
  // The step columns of the step tables' committed rows (by group), read on
  // first use after a refresh.
  std::map<std::string, StepRows> step_rows;
  // Committed rows of each time-varying gate's samples (by gate index), read
  // on first use after a refresh: samples are in step order.
  std::map<int, int64_t> gate_samples_committed;

  [[noreturn]] void fail(ErrorCode code, const std::string& field, const std::string& what) const {
    throw TraceError(code, path, field, what);
  }

  hid_t dataset(const std::string& p) {
    auto it = open_datasets.find(p);
    if (it != open_datasets.end()) return it->second.get();
    if (!h5::link_exists(opened.file.get(), p)) fail(ErrorCode::Schema, p, "dataset missing");
    h5::Handle d = h5::dataset(H5Dopen2(opened.file.get(), p.c_str(), H5P_DEFAULT));
    if (!d) fail(ErrorCode::Schema, p, "is not a dataset: " + h5::take_error_message());
    auto exp = expected_elem.find(p);
    if (exp != expected_elem.end()) {
      h5::Handle type = h5::datatype(H5Dget_type(d.get()));
      Elem found;
      bool known = h5::classify_type(type.get(), &found);
      if (!known || found != exp->second)
        fail(ErrorCode::Schema, p,
             std::string("element type is ") + (known ? h5::elem_name(found) : "not a number") +
                 " (expected " + h5::elem_name(exp->second) + ")");
    }
    hid_t id = d.get();
    open_datasets.emplace(p, std::move(d));
    return id;
  }

  bool has(const std::string& p) const { return h5::link_exists(opened.file.get(), p); }

  std::vector<hsize_t> dims(const std::string& p) { return h5::extent(dataset(p)); }
  // The extent of p, which must have `rank` axes: callers index it.
  std::vector<hsize_t> dims(const std::string& p, size_t rank) {
    std::vector<hsize_t> e = dims(p);
    if (e.size() != rank)
      fail(ErrorCode::Schema, p,
           "has rank " + std::to_string(e.size()) + " (expected " + std::to_string(rank) + ")");
    return e;
  }

  // Reads the hyperslab [start, start + count) of dataset p into memory of
  // type T, after checking rank, bounds and size.
  template <typename T>
  std::vector<T> read(const std::string& p, std::vector<hsize_t> start, std::vector<hsize_t> count,
                      hid_t mem_type = -1) {
    hid_t d = dataset(p);
    std::vector<hsize_t> extent = h5::extent(d);
    if (extent.size() != start.size())
      fail(ErrorCode::Schema, p,
           "has rank " + std::to_string(extent.size()) + " (expected " +
               std::to_string(start.size()) + ")");
    uint64_t total = 1;
    for (size_t i = 0; i < extent.size(); ++i) {
      if (start[i] > extent[i] || count[i] > extent[i] - start[i])
        fail(ErrorCode::Usage, p,
             "read of [" + std::to_string(start[i]) + ", " + std::to_string(start[i] + count[i]) +
                 ") on axis " + std::to_string(i) + " outside extent " + std::to_string(extent[i]));
      // Checked before it is multiplied: extents come from the file.
      if (count[i] != 0 && total > static_cast<uint64_t>(kMaxReadBytes) / count[i])
        fail(ErrorCode::TooLarge, p,
             "a read of this size exceeds the reader's limit of " + std::to_string(kMaxReadBytes) +
                 " bytes");
      total *= count[i];
      if (total * sizeof(T) > static_cast<uint64_t>(kMaxReadBytes))
        fail(ErrorCode::TooLarge, p,
             "a read of this size exceeds the reader's limit of " + std::to_string(kMaxReadBytes) +
                 " bytes");
    }
    std::vector<T> out(static_cast<size_t>(total));
    if (total == 0) return out;
    h5::Handle fspace = h5::dataspace(H5Dget_space(d));
    if (!extent.empty())
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                          nullptr);
    h5::Handle mspace = h5::dataspace(
        extent.empty() ? H5Screate(H5S_SCALAR)
                       : H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
    hid_t mt = mem_type >= 0 ? mem_type : h5::memory_type(elem_of<T>());
    if (H5Dread(d, mt, mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) < 0)
      fail(ErrorCode::Schema, p, "read failed: " + h5::take_error_message());
    return out;
  }

  template <typename T>
  std::vector<T> read_1d(const std::string& p, int64_t begin, int64_t end) {
    return read<T>(p, {hsize_t(begin)}, {hsize_t(end - begin)});
  }

  template <typename T>
  T read_scalar(const std::string& p) {
    return read<T>(p, {}, {})[0];
  }

  int64_t min_extent(const char* const* paths, size_t n) {
    return min_extent(std::vector<std::string>(paths, paths + n));
  }
  int64_t min_extent(const std::vector<std::string>& paths) {
    int64_t m = INT64_MAX;
    for (const std::string& p : paths) {
      std::vector<hsize_t> e = dims(p);
      if (e.size() != 1) fail(ErrorCode::Schema, p, "expected a 1-D column");
      m = std::min<int64_t>(m, static_cast<int64_t>(e[0]));
    }
    return m;
  }

  void refresh() {
    for (auto& [p, d] : open_datasets) H5Drefresh(d.get());
    complete = read_scalar<uint8_t>("/run/complete") == 1;
    // /steps/kind is written last in every flush: it counts committed steps.
    int64_t s = min_extent(kStepColumns, std::size(kStepColumns));
    int64_t t = min_extent(kTokenColumns, std::size(kTokenColumns));
    int64_t e = min_extent(column_paths(table_of<Event>()));
    int64_t t_committed = 0, e_committed = 0;
    if (s > 0) {
      int32_t first = read_1d<int32_t>("/steps/first_token", s - 1, s)[0];
      int32_t count = read_1d<int32_t>("/steps/n_tokens", s - 1, s)[0];
      int64_t eb = read_1d<int64_t>("/steps/event_begin", s - 1, s)[0];
      int64_t ec = read_1d<int64_t>("/steps/event_count", s - 1, s)[0];
      t_committed = int64_t(first) + count;
      // Values from the file: a sum past int64 is no event count either.
      e_committed = eb >= 0 && ec >= 0 && ec <= INT64_MAX - eb ? eb + ec : -1;
    }
    if (t_committed > t || e_committed > e || t_committed < 0 || e_committed < 0)
      fail(ErrorCode::Schema, "/steps",
           "the last step refers to tokens or events beyond the end of /tokens or /events");
    n_steps = s;
    n_tokens = t_committed;
    n_events = e_committed;
    step_rows.clear();
    gate_samples_committed.clear();
  }

  // The step column of a step table's committed rows: rows are in step order
  // and a flush writes them before it commits its steps, so the committed
  // ones are those before the first row of a step not yet committed.
  const std::vector<int32_t>& committed_steps(const RowTableSpec& t) {
    StepRows& rows = step_rows[t.group];
    if (rows.read) return rows.steps;
    rows.steps.clear();
    if (opened.minor_version >= t.since_minor) {
      const int64_t n = min_extent(column_paths(t));
      rows.steps = read_1d<int32_t>(t.group + "/step", 0, n);
      size_t committed = 0;
      while (committed < rows.steps.size() && rows.steps[committed] < n_steps) ++committed;
      rows.steps.resize(committed);
    }
    rows.read = true;
    return rows.steps;
  }

  // The rows [lo, hi) of a step table's rows of `step` (committed ones).
  std::pair<int64_t, int64_t> rows_of_step(const RowTableSpec& t, int64_t step) {
    if (step < 0 || step >= n_steps)
      fail(ErrorCode::Usage, t.group + "/step",
           "step " + std::to_string(step) + " outside [0, " + std::to_string(n_steps) + ")");
    const std::vector<int32_t>& steps = committed_steps(t);
    auto [lo, hi] = std::equal_range(steps.begin(), steps.end(), static_cast<int32_t>(step));
    return {lo - steps.begin(), hi - steps.begin()};
  }

  // Rows [begin, end) of a row table, each column read once.
  template <typename Row>
  std::vector<Row> table_rows(const RowTableSpec& t, int64_t begin, int64_t end) {
    KVSCOPE_CHECK(t.row_size == sizeof(Row), t.group + ": read as another row type");
    std::vector<Row> out(static_cast<size_t>(end - begin));
    if (out.empty()) return out;
    for (const ColumnSpec& c : t.columns) {
      const std::vector<uint8_t> raw = read_elements(t.path(c), c.elem, begin, end);
      const size_t size = h5::elem_size(c.elem);
      for (size_t i = 0; i < out.size(); ++i) c.load(raw.data() + i * size, &out[i]);
    }
    return out;
  }

  // Elements [begin, end) of a 1-D column, in memory as `elem`.
  std::vector<uint8_t> read_elements(const std::string& p, Elem elem, int64_t begin, int64_t end) {
    hid_t d = dataset(p);
    std::vector<hsize_t> extent = dims(p, 1);
    if (begin < 0 || end < begin || hsize_t(end) > extent[0])
      fail(ErrorCode::Usage, p,
           "read of [" + std::to_string(begin) + ", " + std::to_string(end) +
               ") on axis 0 outside extent " + std::to_string(extent[0]));
    const hsize_t start = hsize_t(begin), count = hsize_t(end - begin);
    if (count * h5::elem_size(elem) > static_cast<uint64_t>(kMaxReadBytes))
      fail(ErrorCode::TooLarge, p,
           "a read of this size exceeds the reader's limit of " + std::to_string(kMaxReadBytes) +
               " bytes");
    std::vector<uint8_t> out(static_cast<size_t>(count) * h5::elem_size(elem));
    if (count == 0) return out;
    h5::Handle fspace = h5::dataspace(H5Dget_space(d));
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
    h5::Handle mspace = h5::dataspace(H5Screate_simple(1, &count, nullptr));
    if (H5Dread(d, h5::memory_type(elem), mspace.get(), fspace.get(), H5P_DEFAULT, out.data()) < 0)
      fail(ErrorCode::Schema, p, "read failed: " + h5::take_error_message());
    return out;
  }

  void check_range(const char* what, int64_t begin, int64_t end, int64_t limit) const {
    if (begin < 0 || end < begin || end > limit)
      fail(ErrorCode::Usage, what,
           "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside [0, " +
               std::to_string(limit) + ")");
  }

  // The value dataset of series index `series`; a bad index is the caller's error.
  std::string series_path(int series) const {
    if (series < 0 || series >= static_cast<int>(layout.series.size()))
      fail(ErrorCode::Usage, "/series",
           "no series " + std::to_string(series) + " (the trace has " +
               std::to_string(layout.series.size()) + ")");
    return "/series/" + layout.series[size_t(series)].name + "/value";
  }

  void check_head(int layer, int kv_head) const {
    if (layer < 0 || layer >= run.model.n_layers || kv_head < 0 || kv_head >= run.model.n_kv_heads)
      fail(ErrorCode::Usage, "head",
           "(" + std::to_string(layer) + ", " + std::to_string(kv_head) + ") outside L x K");
  }
};

std::unique_ptr<TraceReader> TraceReader::open(const std::string& path) {
  return from_opened(path, open_trace_file(path));
}

std::unique_ptr<TraceReader> TraceReader::open_image(const std::string& name, const void* data,
                                                     size_t size) {
  return from_opened(name, open_trace_image(name, data, size));
}

std::unique_ptr<TraceReader> TraceReader::from_opened(const std::string& path, OpenedTrace opened) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->opened = std::move(opened);
  std::vector<Problem> problems;
  read_run_info(impl->opened.file.get(), &impl->run, &impl->layout, &problems);
  if (!problems.empty())
    throw TraceError(problems[0].code, path, problems[0].field, problems[0].message);
  for (const DatasetSpec& spec :
       datasets_for(impl->layout, static_cast<int64_t>(impl->run.tier_names.size()),
                    impl->opened.minor_version))
    impl->expected_elem[spec.path] = spec.elem;
  impl->refresh();
  return std::unique_ptr<TraceReader>(new TraceReader(std::move(impl)));
}

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::~TraceReader() = default;

const std::string& TraceReader::path() const {
  return impl_->path;
}
int64_t TraceReader::format_version() const {
  return impl_->opened.version;
}
int64_t TraceReader::format_minor_version() const {
  return impl_->opened.minor_version;
}
std::string TraceReader::writer() const {
  return impl_->opened.writer;
}
const RunInfo& TraceReader::run() const {
  return impl_->run;
}
const CaptureLayout& TraceReader::layout() const {
  return impl_->layout;
}
void TraceReader::refresh() {
  impl_->refresh();
}
bool TraceReader::complete() const {
  return impl_->complete;
}
int64_t TraceReader::n_steps() const {
  return impl_->n_steps;
}
int64_t TraceReader::n_tokens() const {
  return impl_->n_tokens;
}
int64_t TraceReader::n_events() const {
  return impl_->n_events;
}

std::string TraceReader::finish_reason() const {
  static const char* names[] = {"unknown", "length", "eos", "stop", "error", "interrupted"};
  uint8_t v = impl_->read_scalar<uint8_t>("/generation/finish_reason");
  return v < 6 ? names[v] : "unknown";
}

int8_t TraceReader::task_success() const {
  return impl_->read_scalar<int8_t>("/generation/success");
}

double TraceReader::task_score() const {
  if (impl_->opened.minor_version >= 6) return impl_->read_scalar<double>("/generation/score");
  const int8_t success = task_success();
  return success < 0 ? std::numeric_limits<double>::quiet_NaN() : double(success);
}

double TraceReader::answer_logprob() const {
  if (impl_->opened.minor_version < 10) return std::numeric_limits<double>::quiet_NaN();
  return impl_->read_scalar<double>("/generation/answer_logprob");
}

int64_t TraceReader::answer_rank() const {
  if (impl_->opened.minor_version < 10) return -1;
  return impl_->read_scalar<int64_t>("/generation/answer_rank");
}

std::vector<StepRecord> TraceReader::steps(int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  m.check_range("/steps", begin, end, m.n_steps);
  auto kind = m.read_1d<uint8_t>("/steps/kind", begin, end);
  auto first = m.read_1d<int32_t>("/steps/first_token", begin, end);
  auto n = m.read_1d<int32_t>("/steps/n_tokens", begin, end);
  auto t0 = m.read_1d<double>("/steps/t_start_s", begin, end);
  auto wall = m.read_1d<double>("/steps/wall_s", begin, end);
  auto entries = m.read_1d<int64_t>("/steps/entries", begin, end);
  auto bytes = m.read_1d<int64_t>("/steps/kv_bytes", begin, end);
  auto eb = m.read_1d<int64_t>("/steps/event_begin", begin, end);
  auto ec = m.read_1d<int64_t>("/steps/event_count", begin, end);
  std::vector<StepRecord> out(static_cast<size_t>(end - begin));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].kind = kind[i] == 0   ? StepKind::Prefill
                  : kind[i] == 2 ? StepKind::Reconstruction
                                 : StepKind::Decode;
    out[i].first_token = first[i];
    out[i].n_tokens = n[i];
    out[i].t_start_s = t0[i];
    out[i].wall_s = wall[i];
    out[i].entries = entries[i];
    out[i].kv_bytes = bytes[i];
    out[i].event_begin = eb[i];
    out[i].event_count = ec[i];
  }
  return out;
}

std::vector<TokenRecord> TraceReader::tokens(int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  m.check_range("/tokens", begin, end, m.n_tokens);
  std::vector<TokenRecord> out(static_cast<size_t>(end - begin));
  if (out.empty()) return out;
  auto id = m.read_1d<int32_t>("/tokens/id", begin, end);
  auto pos = m.read_1d<int32_t>("/tokens/position", begin, end);
  auto role = m.read_1d<uint8_t>("/tokens/role", begin, end);
  auto step = m.read_1d<int32_t>("/tokens/step", begin, end);
  auto tb = m.read_1d<int64_t>("/tokens/text_begin", begin, end);
  auto tl = m.read_1d<int32_t>("/tokens/text_len", begin, end);
  auto po = m.read_1d<int64_t>("/tokens/prompt_offset", begin, end);
  // One read for all the text of the range.
  int64_t lo = INT64_MAX, hi = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (tb[i] < 0 || tl[i] < 0 || tb[i] > INT64_MAX - tl[i])
      m.fail(ErrorCode::Schema, "/tokens/text_begin", "negative or overflowing offset or length");
    lo = std::min(lo, tb[i]);
    hi = std::max(hi, tb[i] + tl[i]);
  }
  int64_t nbytes = static_cast<int64_t>(m.dims("/tokens/text_bytes", 1)[0]);
  if (hi > nbytes)
    m.fail(ErrorCode::Schema, "/tokens/text_begin",
           "points past the end of /tokens/text_bytes (" + std::to_string(nbytes) + " bytes)");
  std::vector<uint8_t> text =
      hi > lo ? m.read_1d<uint8_t>("/tokens/text_bytes", lo, hi) : std::vector<uint8_t>{};
  for (size_t i = 0; i < out.size(); ++i) {
    TokenRecord& t = out[i];
    t.id = id[i];
    t.position = pos[i];
    t.role = role[i] < kTokenRoleCount ? static_cast<TokenRole>(role[i]) : TokenRole::Prompt;
    t.step = step[i];
    t.prompt_offset = po[i];
    t.text.assign(reinterpret_cast<const char*>(text.data()) + (tb[i] - lo), size_t(tl[i]));
  }
  return out;
}

std::vector<Event> TraceReader::events(int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  m.check_range("/events", begin, end, m.n_events);
  std::vector<Event> out = m.table_rows<Event>(table_of<Event>(), begin, end);
  for (size_t i = 0; i < out.size(); ++i)
    if (static_cast<uint8_t>(out[i].kind) >= kEventKindCount)
      m.fail(ErrorCode::Schema, "/events/kind",
             "row " + std::to_string(begin + int64_t(i)) + " has unknown kind " +
                 std::to_string(static_cast<unsigned>(out[i].kind)));
  return out;
}

std::vector<Event> TraceReader::step_events(int64_t step) const {
  StepRecord s = steps(step, step + 1)[0];
  if (s.event_begin < 0 || s.event_count < 0 || s.event_count > INT64_MAX - s.event_begin)
    impl_->fail(ErrorCode::Schema, "/steps/event_begin",
                "step " + std::to_string(step) + " has a negative or overflowing event range");
  return events(s.event_begin, s.event_begin + s.event_count);
}

std::vector<uint8_t> TraceReader::event_kinds(int64_t begin, int64_t end) const {
  impl_->check_range("/events/kind", begin, end, impl_->n_events);
  return impl_->read_1d<uint8_t>("/events/kind", begin, end);
}

std::vector<uint8_t> TraceReader::token_roles(int64_t begin, int64_t end) const {
  impl_->check_range("/tokens/role", begin, end, impl_->n_tokens);
  return impl_->read_1d<uint8_t>("/tokens/role", begin, end);
}

HeadLifetimes TraceReader::lifetimes(int layer, int kv_head, int64_t token_begin,
                                     int64_t token_end) const {
  Impl& m = *impl_;
  m.check_head(layer, kv_head);
  if (token_end < 0) token_end = m.n_tokens;
  m.check_range("/lifetimes", token_begin, token_end, m.n_tokens);
  HeadLifetimes out;
  out.token_begin = token_begin;
  std::vector<hsize_t> start{hsize_t(layer), hsize_t(kv_head), hsize_t(token_begin)};
  std::vector<hsize_t> count{1, 1, hsize_t(token_end - token_begin)};
  out.admit_step = m.read<int32_t>("/lifetimes/admit_step", start, count);
  out.evict_step = m.read<int32_t>("/lifetimes/evict_step", start, count);
  if (!m.complete) {
    // A flush writes lifetimes before it commits its steps (/steps last), so
    // an incomplete trace can hold values of steps not committed yet; in
    // this view those admissions and evictions have not happened.
    for (std::vector<int32_t>* steps : {&out.admit_step, &out.evict_step})
      for (int32_t& s : *steps)
        if (s >= m.n_steps) s = -1;
  }
  return out;
}

std::vector<TierInterval> TraceReader::intervals(int layer, int kv_head) const {
  Impl& m = *impl_;
  m.check_head(layer, kv_head);
  if (n_tiers() <= 1) return {};
  int64_t rows = static_cast<int64_t>(m.dims("/lifetimes/intervals/layer", 1)[0]);
  int64_t slot = int64_t(layer) * n_kv_heads() + kv_head;
  int64_t begin = 0, end = rows;
  if (m.complete) {  // sorted with an index: read only this head's rows
    auto idx = m.read_1d<int64_t>("/lifetimes/interval_index", slot, slot + 2);
    if (idx[0] < 0 || idx[1] < idx[0] || idx[1] > rows)
      m.fail(ErrorCode::Schema, "/lifetimes/interval_index", "entries outside the interval table");
    begin = idx[0];
    end = idx[1];
  }
  std::vector<TierInterval> out;
  const int64_t block = 1 << 16;
  for (int64_t b = begin; b < end; b += block) {
    int64_t e = std::min(end, b + block);
    // An incomplete trace's rows are in closing order and a flush writes
    // those of its steps before it commits them: the committed view has
    // the intervals closed at committed steps.
    for (const TierInterval& iv : m.table_rows<TierInterval>(table_of<TierInterval>(), b, e))
      if (iv.layer == layer && iv.kv_head == kv_head && (m.complete || iv.end_step < m.n_steps))
        out.push_back(iv);
  }
  return out;
}

std::vector<int32_t> TraceReader::occupancy(int64_t step) const {
  Impl& m = *impl_;
  m.check_range("/occupancy/entries", step, step + 1, m.n_steps);
  hsize_t L = hsize_t(n_layers()), K = hsize_t(n_kv_heads()), R = hsize_t(n_tiers());
  return m.read<int32_t>("/occupancy/entries", {hsize_t(step), 0, 0, 0}, {1, L, K, R});
}

std::vector<int32_t> TraceReader::occupancy_series(int layer, int kv_head, int64_t begin,
                                                   int64_t end) const {
  Impl& m = *impl_;
  m.check_head(layer, kv_head);
  m.check_range("/occupancy/entries", begin, end, m.n_steps);
  hsize_t R = hsize_t(n_tiers());
  return m.read<int32_t>("/occupancy/entries",
                         {hsize_t(begin), hsize_t(layer), hsize_t(kv_head), 0},
                         {hsize_t(end - begin), 1, 1, R});
}

std::vector<int64_t> TraceReader::tier_bytes(int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  m.check_range("/occupancy/tier_bytes", begin, end, m.n_steps);
  return m.read<int64_t>("/occupancy/tier_bytes", {hsize_t(begin), 0},
                         {hsize_t(end - begin), hsize_t(n_tiers())});
}

ReceivedRow TraceReader::received(int64_t step, int layer, int kv_head) const {
  Impl& m = *impl_;
  if (!m.layout.received) m.fail(ErrorCode::Usage, "/attention/received", "not captured");
  m.check_head(layer, kv_head);
  m.check_range("/attention/received", step, step + 1, m.n_steps);
  std::vector<hsize_t> at{hsize_t(step), hsize_t(layer), hsize_t(kv_head)};
  int64_t offset = m.read<int64_t>("/attention/received/offset", at, {1, 1, 1})[0];
  int32_t count = m.read<int32_t>("/attention/received/count", at, {1, 1, 1})[0];
  ReceivedRow row;
  row.layer = static_cast<int16_t>(layer);
  row.kv_head = static_cast<int16_t>(kv_head);
  if (count <= 0) return row;
  if (offset < 0 || offset > INT64_MAX - count)
    m.fail(ErrorCode::Schema, "/attention/received/offset", "negative or overflowing offset");
  row.tokens = m.read_1d<int32_t>("/attention/received/token", offset, offset + count);
  row.mass = m.read_1d<float>("/attention/received/mass", offset, offset + count);
  return row;
}

int64_t TraceReader::pooled_query_blocks() const {
  if (impl_->layout.pooled_block <= 0) return 0;
  return static_cast<int64_t>(impl_->dims("/attention/pooled/max", 4)[2]);
}

int64_t TraceReader::pooled_key_blocks() const {
  if (impl_->layout.pooled_block <= 0) return 0;
  return static_cast<int64_t>(impl_->dims("/attention/pooled/max", 4)[3]);
}

PooledTile TraceReader::pooled(int layer, int head, int64_t qb_begin, int64_t qb_end,
                               int64_t kb_begin, int64_t kb_end) const {
  Impl& m = *impl_;
  if (m.layout.pooled_block <= 0) m.fail(ErrorCode::Usage, "/attention/pooled", "not captured");
  if (layer < 0 || layer >= n_layers() || head < 0 || head >= n_heads())
    m.fail(ErrorCode::Usage, "/attention/pooled", "(layer, head) outside L x H");
  std::vector<hsize_t> start{hsize_t(layer), hsize_t(head), hsize_t(qb_begin), hsize_t(kb_begin)};
  std::vector<hsize_t> count{1, 1, hsize_t(qb_end - qb_begin), hsize_t(kb_end - kb_begin)};
  if (qb_end < qb_begin || kb_end < kb_begin)
    m.fail(ErrorCode::Usage, "/attention/pooled", "empty or inverted range");
  PooledTile tile{qb_begin, qb_end, kb_begin, kb_end, {}, {}};
  for (int which = 0; which < 2; ++which) {
    std::vector<uint16_t> raw =
        m.read<uint16_t>(which == 0 ? "/attention/pooled/max" : "/attention/pooled/mean", start,
                         count, h5::memory_type(Elem::F16));
    std::vector<float>& out = which == 0 ? tile.max : tile.mean;
    out.resize(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) out[i] = half_to_float(raw[i]);
  }
  return tile;
}

std::vector<float> TraceReader::dense_rows(int head_index, int64_t token_begin,
                                           int64_t token_end) const {
  Impl& m = *impl_;
  if (head_index < 0 || head_index >= static_cast<int>(m.layout.dense_heads.size()))
    m.fail(ErrorCode::Usage, "/attention/dense/weight", "no such dense head");
  std::vector<hsize_t> e = m.dims("/attention/dense/weight", 3);
  m.check_range("/attention/dense/weight", token_begin, token_end, static_cast<int64_t>(e[1]));
  return m.read<float>("/attention/dense/weight", {hsize_t(head_index), hsize_t(token_begin), 0},
                       {1, hsize_t(token_end - token_begin), e[2]});
}

TopkRow TraceReader::topk(int64_t token) const {
  Impl& m = *impl_;
  if (m.layout.topk <= 0) m.fail(ErrorCode::Usage, "/attention/topk", "not captured");
  std::vector<hsize_t> e = m.dims("/attention/topk/index", 4);
  m.check_range("/attention/topk/index", token, token + 1, static_cast<int64_t>(e[0]));
  hsize_t L = hsize_t(n_layers()), H = hsize_t(n_heads()), k = hsize_t(m.layout.topk);
  TopkRow row;
  row.token = static_cast<int32_t>(token);
  row.index = m.read<int32_t>("/attention/topk/index", {hsize_t(token), 0, 0, 0}, {1, L, H, k});
  row.weight = m.read<float>("/attention/topk/weight", {hsize_t(token), 0, 0, 0}, {1, L, H, k});
  return row;
}

int TraceReader::gate_index(const std::string& name) const {
  const auto& gates = impl_->layout.gates;
  for (size_t i = 0; i < gates.size(); ++i)
    if (gates[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<float> TraceReader::gate_values(int gate, int layer, int kv_head, int64_t token_begin,
                                            int64_t token_end) const {
  Impl& m = *impl_;
  if (gate < 0 || gate >= static_cast<int>(m.layout.gates.size()))
    m.fail(ErrorCode::Usage, "/gates", "no such gate");
  m.check_head(layer, kv_head);
  if (token_end < 0) token_end = m.n_tokens;
  m.check_range("/gates", token_begin, token_end, m.n_tokens);
  return m.read<float>("/gates/" + m.layout.gates[size_t(gate)].name + "/value",
                       {hsize_t(layer), hsize_t(kv_head), hsize_t(token_begin)},
                       {1, 1, hsize_t(token_end - token_begin)});
}

int64_t TraceReader::gate_sample_count(int gate) const {
  Impl& m = *impl_;
  if (gate < 0 || gate >= static_cast<int>(m.layout.gates.size()) ||
      !m.layout.gates[size_t(gate)].time_varying)
    return 0;
  const std::string p = "/gates/" + m.layout.gates[size_t(gate)].name + "/samples/step";
  const int64_t rows = static_cast<int64_t>(m.dims(p, 1)[0]);
  if (m.complete) return rows;
  // A flush writes the samples of its steps before it commits them.
  auto it = m.gate_samples_committed.find(gate);
  if (it != m.gate_samples_committed.end()) return it->second;
  const std::vector<int32_t> steps = m.read_1d<int32_t>(p, 0, rows);
  int64_t n = 0;
  while (n < rows && steps[size_t(n)] < m.n_steps) ++n;
  return m.gate_samples_committed[gate] = n;
}

std::vector<GateValue> TraceReader::gate_samples(int gate, int64_t begin, int64_t end,
                                                 std::vector<int32_t>* steps_out) const {
  Impl& m = *impl_;
  m.check_range("/gates samples", begin, end, gate_sample_count(gate));
  std::string base = "/gates/" + m.layout.gates[size_t(gate)].name + "/samples/";
  auto step = m.read_1d<int32_t>(base + "step", begin, end);
  auto layer = m.read_1d<int16_t>(base + "layer", begin, end);
  auto head = m.read_1d<int16_t>(base + "kv_head", begin, end);
  auto token = m.read_1d<int32_t>(base + "token", begin, end);
  auto value = m.read_1d<float>(base + "value", begin, end);
  std::vector<GateValue> out(step.size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = GateValue{gate, layer[i], head[i], token[i], value[i], true};
  if (steps_out) *steps_out = step;
  return out;
}

int TraceReader::series_index(const std::string& name) const {
  const auto& all = impl_->layout.series;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<float> TraceReader::series_values(int series, int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  const std::string p = m.series_path(series);
  m.check_range(p.c_str(), begin, end, m.n_steps);
  return m.read<float>(p, {hsize_t(begin), 0, 0},
                       {hsize_t(end - begin), hsize_t(n_layers()), hsize_t(n_kv_heads())});
}

std::vector<float> TraceReader::series_head(int series, int layer, int kv_head, int64_t begin,
                                            int64_t end) const {
  Impl& m = *impl_;
  const std::string p = m.series_path(series);
  m.check_head(layer, kv_head);
  m.check_range(p.c_str(), begin, end, m.n_steps);
  return m.read<float>(p, {hsize_t(begin), hsize_t(layer), hsize_t(kv_head)},
                       {hsize_t(end - begin), 1, 1});
}

template <typename Row>
std::vector<Row> TraceReader::rows() const {
  const RowTableSpec& t = table_of<Row>();
  return impl_->table_rows<Row>(t, 0, static_cast<int64_t>(impl_->committed_steps(t).size()));
}

template <typename Row>
std::vector<Row> TraceReader::rows_of_step(int64_t step) const {
  const RowTableSpec& t = table_of<Row>();
  auto [lo, hi] = impl_->rows_of_step(t, step);
  return impl_->table_rows<Row>(t, lo, hi);
}

template <typename Row>
int64_t TraceReader::row_count() const {
  return static_cast<int64_t>(impl_->committed_steps(table_of<Row>()).size());
}

int64_t TraceReader::table_row_count(const std::string& group) const {
  for (const RowTableSpec* t : step_tables())
    if (t->group == group) return static_cast<int64_t>(impl_->committed_steps(*t).size());
  impl_->fail(ErrorCode::Usage, group, "is no table of step rows");
}

#define KVSCOPE_READ_TABLE(Row)                                                 \
  template std::vector<Row> TraceReader::rows<Row>() const;                     \
  template std::vector<Row> TraceReader::rows_of_step<Row>(int64_t step) const; \
  template int64_t TraceReader::row_count<Row>() const;
KVSCOPE_STEP_TABLES(KVSCOPE_READ_TABLE)
#undef KVSCOPE_READ_TABLE

std::vector<float> TraceReader::oracle_kl(int64_t begin, int64_t end) const {
  Impl& m = *impl_;
  if (!m.layout.oracle) m.fail(ErrorCode::Usage, "/oracle", "not captured");
  m.check_range("/oracle/kl", begin, end, m.n_steps);
  return m.read_1d<float>("/oracle/kl", begin, end);
}

std::vector<float> TraceReader::oracle_lost_mass(int64_t step) const {
  Impl& m = *impl_;
  if (!m.layout.oracle) m.fail(ErrorCode::Usage, "/oracle", "not captured");
  m.check_range("/oracle/lost_mass", step, step + 1, m.n_steps);
  return m.read<float>("/oracle/lost_mass", {hsize_t(step), 0, 0},
                       {1, hsize_t(n_layers()), hsize_t(n_heads())});
}

std::vector<float> TraceReader::oracle_recall(int64_t step) const {
  Impl& m = *impl_;
  if (!m.layout.oracle) m.fail(ErrorCode::Usage, "/oracle", "not captured");
  m.check_range("/oracle/recall", step, step + 1, m.n_steps);
  return m.read<float>("/oracle/recall", {hsize_t(step), 0, 0},
                       {1, hsize_t(n_layers()), hsize_t(n_kv_heads())});
}

std::string TraceReader::generated_text() const {
  Impl& m = *impl_;
  int64_t n = static_cast<int64_t>(m.dims("/generation/text_bytes", 1)[0]);
  std::vector<uint8_t> bytes = m.read_1d<uint8_t>("/generation/text_bytes", 0, n);
  return std::string(bytes.begin(), bytes.end());
}

int64_t TraceReader::file_bytes() const {
  struct stat st {};
  return stat(impl_->path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace kvscope::trace
