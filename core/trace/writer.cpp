#include "core/trace/writer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <unordered_map>

#include "core/trace/append_column.h"
#include "core/trace/attention_maps.h"
#include "core/trace/error.h"
#include "core/trace/file_layout.h"
#include "core/trace/h5.h"
#include "core/trace/lifetime_tracker.h"
#include "core/trace/row_tables.h"
#include "core/trace/schema.h"
#include "core/trace/step_arrays.h"
#include "kvscope_version.h"

namespace kvscope::trace {

namespace {

// Fault injection for the kill test (tests/capture/test_kill.cpp): with
// KVSCOPE_KILL_AT_WRITE=N in the environment, the process SIGKILLs itself at
// the N-th point where the writer is about to change the file (creating a
// group or dataset, writing a column, flushing, renaming), so seeded runs
// cover every phase of a capture, the file's creation included. Unset, it
// costs one comparison per point.
void fault_point() {
  static const long long kill_at = [] {
    const char* v = std::getenv("KVSCOPE_KILL_AT_WRITE");
    return v ? std::atoll(v) : -1LL;
  }();
  static long long count = 0;
  if (kill_at >= 0 && count++ == kill_at) raise(SIGKILL);
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

struct TraceWriter::Impl {
  std::string path;
  RunInfo run;
  CaptureLayout layout;
  Options options;
  int64_t L = 0, H = 0, K = 0, R = 0;
  AxisSizes axes;

  h5::Handle file;
  std::map<std::string, h5::Handle> datasets;  // fixed-shape and scalar datasets
  std::unordered_map<std::string, AppendColumn> columns;

  TableColumns events;
  TableColumns intervals;
  std::vector<TableColumns> step_tables;  // row_tables.h's, in order
  LifetimeTracker lifetimes;
  h5::Handle admit_dset, evict_dset;
  std::vector<HeadTokenArray<float>> gate_values;
  std::vector<h5::Handle> gate_dsets;
  size_t closed_intervals_on_disk = 0;

  StepArrays arrays;
  AttentionMaps maps;

  int64_t steps_appended = 0;
  int64_t steps_on_disk = 0;
  int64_t tokens_appended = 0;
  int64_t text_bytes_appended = 0;
  int64_t events_appended = 0;
  int64_t steps_since_flush = 0;
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();
  bool closed = false;

  // ---- creation -------------------------------------------------------------

  void fail(const std::string& field, const std::string& what) const {
    throw TraceError(ErrorCode::Usage, path, field, what);
  }

  void make_group(const std::string& group_path, const std::string& meaning) {
    fault_point();
    create_group(file.get(), path, group_path, meaning);
  }

  void create_dataset(const DatasetSpec& spec) {
    fault_point();
    std::vector<hsize_t> dims;
    h5::Handle d =
        trace::create_dataset(file.get(), path, spec, axes, options.compression_level, &dims);
    if (spec.append_axis == 0) {
      AppendColumn col;
      col.path = spec.path;
      col.elem = spec.elem;
      for (size_t i = 1; i < dims.size(); ++i) col.row_elems *= dims[i];
      col.dset = std::move(d);
      columns.emplace(spec.path, std::move(col));
    } else {
      datasets.emplace(spec.path, std::move(d));
    }
  }

  // `type` is the memory type of T (H5T_NATIVE_UINT8 for uint8_t, ...).
  template <typename T>
  void write_scalar(const char* dset_path, hid_t type, T value) {
    H5Dwrite(datasets.at(dset_path).get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value);
  }

  void create_file() {
    h5::silence_library_errors();
    check_run_for_writing(path, run, layout);
    if (run.created_utc.empty()) run.created_utc = utc_now();
    if (run.tool_version.empty()) run.tool_version = KVSCOPE_VERSION_STRING;
    L = run.model.n_layers;
    H = run.model.n_heads;
    K = run.model.n_kv_heads;
    R = static_cast<int64_t>(run.tier_names.size());
    axes = fixed_axis_sizes(run.model, layout, R);
    maps.init(path, layout, L, H, axes[Axis::KeyBlocks]);
    // The file is built under a temporary name and renamed once its
    // superblock, groups, datasets and /run are on disk, so the trace's own
    // path never names a file a reader cannot open, even if the capture is
    // killed while creating it (a killed creation leaves only `<path>.creating`).
    const std::string creating = path + ".creating";
    create_schema(creating);
    resolve_columns();
    start_swmr_under(creating);
  }

  void create_schema(const std::string& creating) {
    h5::Handle fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
    // SWMR needs the latest file format (superblock v3).
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    file = h5::file(H5Fcreate(creating.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!file)
      throw TraceError(ErrorCode::Io, path, "", "cannot create: " + h5::take_error_message());
    for (const GroupSpec& g : group_catalogue()) {
      bool wanted = true;
      if (g.path == "/lifetimes/intervals") wanted = R > 1;
      if (g.path == "/attention/received") wanted = layout.received;
      if (g.path == "/attention/pooled") wanted = layout.pooled_block > 0;
      if (g.path == "/attention/dense") wanted = !layout.dense_heads.empty();
      if (g.path == "/attention/topk") wanted = layout.topk > 0;
      if (g.path == "/oracle") wanted = layout.oracle;
      if (g.path == "/series") wanted = !layout.series.empty();
      if (wanted) make_group(g.path, g.meaning);
    }
    for (const DatasetSpec& spec : datasets_for(layout, R)) create_dataset(spec);
    write_run_attributes(file.get(), run, layout);
    write_layout_attributes(
        file.get(), layout, axes,
        layout.dense_heads.empty() ? -1 : datasets.at("/attention/dense/heads").get());
    write_scalar("/run/complete", H5T_NATIVE_UINT8, uint8_t(0));
    int8_t no_success = -1;
    H5Dwrite(datasets.at("/generation/success").get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL,
             H5P_DEFAULT, &no_success);
  }

  TableColumns table_columns(const RowTableSpec& spec) {
    TableColumns t;
    t.spec = &spec;
    for (const ColumnSpec& c : spec.columns) t.columns.push_back(&columns.at(spec.path(c)));
    t.step = spec.step_rows ? spec.column("step") : nullptr;
    t.layer = spec.column("layer");
    t.kv_head = spec.column("kv_head");
    t.token = spec.column("token");
    return t;
  }

  void resolve_columns() {
    events = table_columns(table_of<Event>());
    if (R > 1) intervals = table_columns(table_of<TierInterval>());
    for (const RowTableSpec* spec : trace::step_tables())
      step_tables.push_back(table_columns(*spec));
    lifetimes.init(L, K, R > 1);
    admit_dset = take_dataset("/lifetimes/admit_step");
    evict_dset = take_dataset("/lifetimes/evict_step");
    arrays.init(path, run, layout, columns);
    for (const GateSpec& g : layout.gates) {
      gate_values.emplace_back();
      gate_values.back().init(L * K, std::numeric_limits<float>::quiet_NaN());
      gate_dsets.push_back(take_dataset("/gates/" + g.name + "/value"));
    }
  }

  void start_swmr_under(const std::string& creating) {
    fault_point();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
      throw TraceError(ErrorCode::Io, path, "", h5::take_error_message());
    fault_point();
    if (options.swmr && H5Fstart_swmr_write(file.get()) < 0)
      throw TraceError(ErrorCode::Io, path, "",
                       "cannot start SWMR writing: " + h5::take_error_message());
    // HDF5 holds the file by descriptor, so the open file can be renamed; a
    // reader finds it already in SWMR mode (no window where the writer's
    // exclusive lock refuses it).
    fault_point();
    if (std::rename(creating.c_str(), path.c_str()) != 0)
      throw TraceError(
          ErrorCode::Io, path, "",
          std::string("cannot move ") + creating + " into place: " + std::strerror(errno));
  }

  h5::Handle take_dataset(const std::string& p) {
    auto it = datasets.find(p);
    h5::Handle d = std::move(it->second);
    datasets.erase(it);
    return d;
  }

  AppendColumn& col(const char* p) { return columns.at(p); }

  // ---- appending ------------------------------------------------------------

  void check_head(const std::string& field, int64_t layer, int64_t kv_head) const {
    if (std::string why = head_problem(layer, kv_head, L, K); !why.empty()) fail(field, why);
  }

  void append(const StepData& sd) {
    if (closed) fail("", "append_step after close");
    const int32_t step = static_cast<int32_t>(steps_appended);
    StepRecord rec = sd.step;
    rec.event_begin = events_appended;
    rec.event_count = static_cast<int64_t>(sd.events.size());
    const int64_t tokens_before = tokens_appended;
    append_tokens(sd, step);
    append_rows(events, sd.events.data(), sd.events.size(), {run, sd.step, tokens_before, 0});
    events_appended += rec.event_count;
    for (const Event& e : sd.events) lifetimes.observe(e);
    append_step_tables(sd, tokens_before);
    append_per_step(sd, step);
    append_step_record(rec);
    double since =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush).count();
    if (steps_since_flush >= options.flush_every_steps || since >= options.flush_every_seconds)
      flush_all();
  }

  // What a step holds beyond its rows: occupancy, attention, gates, series, oracle, text.
  void append_per_step(const StepData& sd, int32_t step) {
    arrays.append(sd);
    for (const PooledRow& row : sd.pooled) maps.queue_pooled(row);
    for (const DenseRow& row : sd.dense) maps.queue_dense(row, tokens_appended);
    for (const GateValue& g : sd.gates) set_gate(g, step);
    if (!sd.generated_text.empty())
      col("/generation/text_bytes")
          .push(reinterpret_cast<const uint8_t*>(sd.generated_text.data()),
                sd.generated_text.size());
  }

  void append_step_record(const StepRecord& rec) {
    col("/steps/kind").push1(static_cast<uint8_t>(rec.kind));
    col("/steps/first_token").push1(rec.first_token);
    col("/steps/n_tokens").push1(rec.n_tokens);
    col("/steps/t_start_s").push1(rec.t_start_s);
    col("/steps/wall_s").push1(rec.wall_s);
    col("/steps/entries").push1(rec.entries);
    col("/steps/kv_bytes").push1(rec.kv_bytes);
    col("/steps/event_begin").push1(rec.event_begin);
    col("/steps/event_count").push1(rec.event_count);
    ++steps_appended;
    ++steps_since_flush;
  }

  void append_tokens(const StepData& sd, int32_t step) {
    if (sd.step.n_tokens != static_cast<int32_t>(sd.tokens.size()))
      fail("/steps/n_tokens", "step " + std::to_string(step) + " says " +
                                  std::to_string(sd.step.n_tokens) + " tokens but carries " +
                                  std::to_string(sd.tokens.size()));
    if (!sd.tokens.empty() && sd.step.first_token != tokens_appended)
      fail("/steps/first_token", "expected " + std::to_string(tokens_appended));
    if (tokens_appended + static_cast<int64_t>(sd.tokens.size()) > layout.max_tokens)
      fail("/tokens", "more tokens than max_tokens = " + std::to_string(layout.max_tokens));
    for (const TokenRecord& t : sd.tokens) {
      col("/tokens/id").push1(t.id);
      col("/tokens/position").push1(t.position);
      col("/tokens/role").push1(static_cast<uint8_t>(t.role));
      col("/tokens/step").push1(step);
      col("/tokens/text_begin").push1(text_bytes_appended);
      col("/tokens/text_len").push1(static_cast<int32_t>(t.text.size()));
      col("/tokens/prompt_offset").push1(t.prompt_offset);
      col("/tokens/text_bytes")
          .push(reinterpret_cast<const uint8_t*>(t.text.data()), t.text.size());
      text_bytes_appended += static_cast<int64_t>(t.text.size());
      ++tokens_appended;
    }
    lifetimes.grow_to(tokens_appended);
    for (auto& g : gate_values) g.grow_to(tokens_appended);
  }

  // The rows of the step tables (row_tables.h), each checked as a whole first.
  void append_step_tables(const StepData& sd, int64_t tokens_before) {
    const RowContext context{run, sd.step, tokens_before, 0};
    for (const TableColumns& t : step_tables) {
      if (t.spec->check_step) refuse(t.spec->check_step(sd, context));
      auto [rows, n] = t.spec->rows_of(sd);
      append_rows(t, rows, n, context);
    }
  }

  void refuse(const RowProblem& p) const {
    if (!p.field.empty()) fail(p.field, p.what);
  }

  // Checks and buffers n rows of a table: the step they name, their head and
  // token, each column's range, then the table's own check.
  void append_rows(const TableColumns& t, const void* rows, size_t n, RowContext context) {
    if (n == 0) return;
    const RowTableSpec& spec = *t.spec;
    const LimitSizes sizes = limit_sizes(run, layout, steps_appended + 1, tokens_appended);
    for (size_t i = 0; i < n; ++i) {
      const void* row = static_cast<const uint8_t*>(rows) + i * spec.row_size;
      context.index = i;
      check_row_identity(t, row);
      for (const ColumnSpec& c : spec.columns)
        if (std::string why = range_problem(c, row, sizes); !why.empty()) fail(spec.path(c), why);
      if (spec.check) refuse(spec.check(row, context));
      t.push(row);
    }
  }

  // What every row of a step must name: that step, a head and a token already fed.
  void check_row_identity(const TableColumns& t, const void* row) const {
    const RowTableSpec& spec = *t.spec;
    if (t.step) {
      const int64_t row_step = int_value(*t.step, row);
      if (row_step != steps_appended)
        fail(spec.group + "/step", spec.noun + " for step " + std::to_string(row_step) +
                                       " appended in step " + std::to_string(steps_appended));
    }
    if (t.layer && t.kv_head)
      check_head(spec.group + "/layer", int_value(*t.layer, row), int_value(*t.kv_head, row));
    if (t.token) {
      const int64_t token = int_value(*t.token, row);
      if (token < 0 || token >= tokens_appended)
        fail(spec.group + "/token", "token " + std::to_string(token) + " not yet fed (" +
                                        std::to_string(tokens_appended) + " tokens)");
    }
  }

  void set_gate(const GateValue& g, int32_t step) {
    if (g.gate < 0 || g.gate >= static_cast<int32_t>(layout.gates.size()))
      fail("/gates", "gate index out of range");
    check_head("/gates", g.layer, g.kv_head);
    if (g.token < 0 || g.token >= tokens_appended) fail("/gates", "token not yet fed");
    gate_values[static_cast<size_t>(g.gate)].set(int64_t(g.layer) * K + g.kv_head, g.token,
                                                 g.value);
    const GateSpec& spec = layout.gates[static_cast<size_t>(g.gate)];
    if (g.sample && spec.time_varying) {
      std::string base = "/gates/" + spec.name + "/samples/";
      columns.at(base + "step").push1(step);
      columns.at(base + "layer").push1(g.layer);
      columns.at(base + "kv_head").push1(g.kv_head);
      columns.at(base + "token").push1(g.token);
      columns.at(base + "value").push1(g.value);
    }
  }

  // ---- flushing -------------------------------------------------------------

  void io_fail(const std::string& field) const {
    throw TraceError(ErrorCode::Io, path, field, h5::take_error_message());
  }

  void write_column(AppendColumn& c) {
    fault_point();
    c.write(path);
  }

  template <typename T>
  void write_head_token_array(hid_t dset, Elem elem, HeadTokenArray<T>& a, const char* field) {
    fault_point();
    std::vector<hsize_t> dims = h5::extent(dset);
    if (dims[2] < static_cast<hsize_t>(a.tokens)) {
      dims[2] = static_cast<hsize_t>(a.tokens);
      if (H5Dset_extent(dset, dims.data()) < 0) io_fail(field);
    }
    h5::Handle fspace = h5::dataspace(H5Dget_space(dset));
    for (int64_t slot = 0; slot < a.slots; ++slot) {
      DirtyRange& d = a.dirty[static_cast<size_t>(slot)];
      if (d.empty()) continue;
      hsize_t start[3] = {hsize_t(slot / K), hsize_t(slot % K), hsize_t(d.lo)};
      hsize_t count[3] = {1, 1, hsize_t(d.hi - d.lo)};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::Handle mspace = h5::dataspace(H5Screate_simple(1, &count[2], nullptr));
      if (H5Dwrite(dset, h5::memory_type(elem), mspace.get(), fspace.get(), H5P_DEFAULT,
                   &a.at(slot, d.lo)) < 0)
        io_fail(field);
      d.clear();
    }
  }

  void write_intervals(const std::vector<TierInterval>& rows, size_t from) {
    fault_point();
    for (size_t i = from; i < rows.size(); ++i) intervals.push(&rows[i]);
  }

  void write_pooled() {
    fault_point();
    if (layout.pooled_block > 0)
      maps.write_pooled(datasets.at("/attention/pooled/max").get(),
                        datasets.at("/attention/pooled/mean").get());
  }

  void write_dense() {
    fault_point();
    if (!layout.dense_heads.empty()) maps.write_dense(datasets.at("/attention/dense/weight").get());
  }

  void flush_all() {
    // Everything a step refers to goes first; /steps last, so that a reader
    // (or a crash) never exposes a step whose data is not on disk.
    for (auto& [p, c] : columns)
      if (p.rfind("/steps/", 0) != 0) write_column(c);  // NOLINT
    write_head_token_array(admit_dset.get(), Elem::I32, lifetimes.admit(), "/lifetimes/admit_step");
    write_head_token_array(evict_dset.get(), Elem::I32, lifetimes.evict(), "/lifetimes/evict_step");
    for (size_t g = 0; g < gate_values.size(); ++g)
      write_head_token_array(gate_dsets[g].get(), Elem::F32, gate_values[g], "/gates/value");
    if (R > 1) {
      write_intervals(lifetimes.closed_intervals(), closed_intervals_on_disk);
      closed_intervals_on_disk = lifetimes.closed_intervals().size();
      for (auto& [p, c] : columns)
        if (p.rfind("/lifetimes/intervals/", 0) == 0) write_column(c);
    }
    write_pooled();
    write_dense();
    for (auto& [p, c] : columns)
      if (p.rfind("/steps/", 0) == 0 && p != "/steps/kind") write_column(c);
    // Two flushes: HDF5's metadata cache writes dirty object headers in its
    // own order, so a kill inside one flush could leave the commit marker's
    // new extent on disk before another dataset's. Only once everything else
    // is on disk does the marker grow.
    fault_point();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) io_fail("");
    write_column(col("/steps/kind"));  // the commit marker: readers count steps by it
    fault_point();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) io_fail("");
    steps_on_disk = steps_appended;
    steps_since_flush = 0;
    last_flush = std::chrono::steady_clock::now();
    if (options.on_flush) options.on_flush(steps_on_disk);
  }

  void finish(const GenerationSummary& summary) {
    flush_all();
    if (R > 1) finalize_intervals();
    static const char* reasons[] = {"unknown", "length", "eos", "stop", "error", "interrupted"};
    uint8_t reason = 0;
    for (uint8_t i = 0; i < 6; ++i)
      if (summary.finish_reason == reasons[i]) reason = i;
    write_scalar("/generation/finish_reason", H5T_NATIVE_UINT8, reason);
    write_scalar("/generation/success", H5T_NATIVE_INT8, summary.success);
    write_scalar("/generation/score", H5T_NATIVE_DOUBLE, summary.score);
    write_scalar("/generation/answer_logprob", H5T_NATIVE_DOUBLE, summary.answer_logprob);
    write_scalar("/generation/answer_rank", H5T_NATIVE_INT64, summary.answer_rank);
    write_scalar("/run/complete", H5T_NATIVE_UINT8, uint8_t(1));
    fault_point();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) io_fail("");
    close_file();
  }

  // Rewrites all intervals sorted by (layer, kv_head, token, begin) and the
  // per-head index, so a reader fetches one head's intervals with one read.
  void finalize_intervals() {
    const std::vector<TierInterval> all = lifetimes.all_intervals();
    const std::vector<int64_t> index = lifetimes.interval_index(all);
    for (auto& [p, c] : columns)
      if (p.rfind("/lifetimes/intervals/", 0) == 0) c.rows_on_disk = 0;  // overwrite from row 0
    write_intervals(all, 0);
    for (auto& [p, c] : columns)
      if (p.rfind("/lifetimes/intervals/", 0) == 0) write_column(c);
    H5Dwrite(datasets.at("/lifetimes/interval_index").get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
             H5P_DEFAULT, index.data());
  }

  void close_file() {
    for (auto& [p, c] : columns) c.dset.reset();
    datasets.clear();
    admit_dset.reset();
    evict_dset.reset();
    gate_dsets.clear();
    file.reset();
    closed = true;
  }
};

std::unique_ptr<TraceWriter> TraceWriter::create(const std::string& path, const RunInfo& run,
                                                 const CaptureLayout& layout) {
  return create(path, run, layout, Options{});
}

std::unique_ptr<TraceWriter> TraceWriter::create(const std::string& path, const RunInfo& run,
                                                 const CaptureLayout& layout, Options options) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->run = run;
  impl->layout = layout;
  impl->options = std::move(options);
  impl->create_file();
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(impl)));
}

double TraceWriter::estimate_memory_bytes(const RunInfo& run, const CaptureLayout& layout,
                                          int64_t tokens, int64_t tokens_per_step,
                                          const Options& options) {
  const double L = double(run.model.n_layers), H = double(run.model.n_heads);
  const double heads = L * double(run.model.n_kv_heads), T = double(tokens);
  const double fed = double(std::max<int64_t>(1, tokens_per_step));
  const double steps = double(std::max<int64_t>(1, options.flush_every_steps));
  // Whole-capture arrays: admit and evict steps, gate values (int32/float).
  double bytes = heads * T * (8.0 + 4.0 * double(layout.gates.size()));
  // Per step, kept until the flush: every head admits (and may evict or
  // select) each token it is fed: ~3 events of ~28 bytes each.
  double per_step = heads * fed * 3 * 28;
  if (layout.received) per_step += heads * T * 8;  // (token, mass) per held entry
  if (layout.pooled_block > 0) {
    const double blocks = std::ceil(T / double(layout.pooled_block));
    per_step += L * H * std::ceil(fed / double(layout.pooled_block)) * blocks * 2 * 4;
  }
  per_step += double(layout.dense_heads.size()) * fed * T * 4;
  if (layout.topk > 0) per_step += L * H * fed * double(layout.topk) * 8;
  per_step += double(layout.series.size()) * heads * 4;  // one float per series and head
  return bytes + per_step * steps;
}

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceWriter::~TraceWriter() {
  if (!impl_ || impl_->closed) return;
  try {
    impl_->flush_all();
  } catch (...) {
    // Best effort: the file stays complete = 0 either way.
  }
  impl_->close_file();
}

void TraceWriter::append_step(const StepData& step) {
  impl_->append(step);
}
void TraceWriter::flush() {
  if (!impl_->closed) impl_->flush_all();
}
void TraceWriter::close(const GenerationSummary& summary) {
  if (!impl_->closed) impl_->finish(summary);
}
int64_t TraceWriter::steps_appended() const {
  return impl_->steps_appended;
}
int64_t TraceWriter::steps_on_disk() const {
  return impl_->steps_on_disk;
}
int64_t TraceWriter::tokens_appended() const {
  return impl_->tokens_appended;
}
const std::string& TraceWriter::path() const {
  return impl_->path;
}

}  // namespace kvscope::trace
