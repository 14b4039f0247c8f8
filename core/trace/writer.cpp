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
#include <regex>
#include <unordered_map>

#include "core/trace/error.h"
#include "core/trace/h5.h"
#include "core/trace/half.h"
#include "core/trace/schema.h"
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

}  // namespace

namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Rows appended along axis 0 of one dataset, buffered until the next flush.
struct AppendColumn {
  h5::Handle dset;
  std::string path;
  Elem elem = Elem::U8;
  size_t row_elems = 1;  // elements per row (product of the other axes)
  hsize_t rows_on_disk = 0;
  std::vector<uint8_t> pending;

  size_t pending_rows() const { return pending.size() / (row_elems * h5::elem_size(elem)); }

  template <typename T>
  void push(const T* data, size_t n_rows) {
    static_assert(std::is_arithmetic<T>::value, "plain numbers only");
    size_t bytes = n_rows * row_elems * sizeof(T);
    size_t at = pending.size();
    pending.resize(at + bytes);
    if (bytes) std::memcpy(pending.data() + at, data, bytes);
  }
  template <typename T>
  void push1(T value) {
    push(&value, 1);
  }
};

// Dirty token range of one head's row in a [L, K, T] array.
struct DirtyRange {
  int64_t lo = INT64_MAX;
  int64_t hi = 0;
  void mark(int64_t t) {
    lo = std::min(lo, t);
    hi = std::max(hi, t + 1);
  }
  bool empty() const { return lo >= hi; }
  void clear() {
    lo = INT64_MAX;
    hi = 0;
  }
};

// An in-memory [L, K, T] array mirrored into a dataset that grows along T.
template <typename T>
struct HeadTokenArray {
  h5::Handle dset;
  Elem elem;
  int64_t slots = 0;     // L * K
  int64_t capacity = 0;  // tokens allocated per slot
  int64_t tokens = 0;    // tokens on the axis
  T fill{};
  std::vector<T> data;  // slot-major: [slot * capacity + t]
  std::vector<DirtyRange> dirty;

  void init(h5::Handle d, Elem e, int64_t n_slots, T fill_value) {
    dset = std::move(d);
    elem = e;
    slots = n_slots;
    fill = fill_value;
    dirty.assign(static_cast<size_t>(slots), DirtyRange{});
  }
  void grow_to(int64_t n_tokens) {
    if (n_tokens <= tokens) return;
    if (n_tokens > capacity) {
      int64_t cap = std::max<int64_t>(n_tokens, std::max<int64_t>(1024, capacity * 2));
      std::vector<T> next(static_cast<size_t>(slots * cap), fill);
      for (int64_t s = 0; s < slots; ++s)
        std::copy_n(data.begin() + s * capacity, tokens, next.begin() + s * cap);
      data.swap(next);
      capacity = cap;
    }
    tokens = n_tokens;
  }
  T& at(int64_t slot, int64_t t) { return data[static_cast<size_t>(slot * capacity + t)]; }
  void set(int64_t slot, int64_t t, T value) {
    at(slot, t) = value;
    dirty[static_cast<size_t>(slot)].mark(t);
  }
};

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

  // The event columns, resolved once: events are the hot path of a capture.
  struct EventColumns {
    AppendColumn *step, *layer, *kv_head, *token, *kind, *score, *reason, *from_tier, *to_tier;
  } ev{};
  struct StallColumns {
    AppendColumn *step, *layer, *kv_head, *token, *wait_s, *needed;
  } stall_columns{};
  struct MergeColumns {
    AppendColumn *step, *layer, *kv_head, *token, *into, *weight;
  } merge_columns{};
  struct RerotationColumns {
    AppendColumn *step, *layer, *kv_head, *token, *position;
  } rerotation_columns{};
  struct ReconstructionColumns {
    AppendColumn *step, *position, *id;
  } reconstruction_columns{};
  struct KeyChannelColumns {
    AppendColumn *step, *layer, *kv_head, *channel;
  } key_channel_columns{};

  HeadTokenArray<int32_t> admit, evict;
  std::vector<HeadTokenArray<float>> gate_values;
  std::vector<AppendColumn*> series_columns;  // /series/<name>/value, in layout order
  std::vector<float> series_nan_row;          // [L, K] of NaN, for steps without values

  // Tier residences (tiered policies only).
  std::unordered_map<int64_t, TierInterval> open_intervals;  // key: slot * 2^32 + token
  std::vector<TierInterval> closed_intervals;
  size_t closed_intervals_on_disk = 0;

  std::map<std::pair<int, int>, PooledRow> pending_pooled;  // (layer, block)
  hsize_t pooled_blocks_on_disk = 0;
  std::vector<DenseRow> pending_dense;
  hsize_t dense_tokens_on_disk = 0;

  int64_t steps_appended = 0;
  int64_t steps_on_disk = 0;
  int64_t tokens_appended = 0;
  int64_t text_bytes_appended = 0;
  int64_t events_appended = 0;
  int64_t received_rows_appended = 0;
  int64_t topk_rows_appended = 0;
  int64_t steps_since_flush = 0;
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();
  bool closed = false;

  // ---- creation -------------------------------------------------------------

  void fail(const std::string& field, const std::string& what) const {
    throw TraceError(ErrorCode::Usage, path, field, what);
  }

  void check_run() const {
    const ModelInfo& m = run.model;
    if (m.n_layers < 1 || m.n_layers > 4096) fail("/run n_layers", "expected 1..4096");
    if (m.n_heads < 1 || m.n_heads > 4096) fail("/run n_heads", "expected 1..4096");
    if (m.n_kv_heads < 1 || m.n_kv_heads > m.n_heads || m.n_heads % m.n_kv_heads != 0)
      fail("/run n_kv_heads", "expected a divisor of n_heads");
    if (layout.max_tokens < 1 || layout.max_tokens > (int64_t(1) << 26))
      fail("/run max_tokens", "expected 1..2^26 (prompt + max new tokens)");
    if (run.tier_names.empty() || run.tier_names.size() > 16)
      fail("/run tier_names", "expected 1..16 tier names");
    if (run.reason_names.empty() || run.reason_names.size() > 65535)
      fail("/run reason_names", "expected 1..65535 reason names");
    if (!run.tier_attended.empty() && run.tier_attended.size() != run.tier_names.size())
      fail("/run tier_attended", "has " + std::to_string(run.tier_attended.size()) +
                                     " flags, expected one per tier name (" +
                                     std::to_string(run.tier_names.size()) + ") or none");
    for (uint8_t flag : run.tier_attended)
      if (flag > 1) fail("/run tier_attended", "flags must be 0 or 1");
    const size_t L = static_cast<size_t>(m.n_layers);
    if (!m.layer_window.empty() && m.layer_window.size() != L)
      fail("/run layer_window", "expected one window per layer or none");
    for (int64_t w : m.layer_window)
      if (w < 0) fail("/run layer_window", "windows must be 0 (global) or positive");
    if (!m.layer_ffn.empty() && m.layer_ffn.size() != L)
      fail("/run layer_ffn", "expected one FFN kind per layer or none");
    for (const std::string& f : m.layer_ffn)
      if (f != "dense" && f != "moe") fail("/run layer_ffn", "expected dense or moe");
    if (!run.tier_formats.empty() && run.tier_formats.size() != run.tier_names.size())
      fail("/run tier_formats",
           "has " + std::to_string(run.tier_formats.size()) +
               " formats (expected one per tier: " + std::to_string(run.tier_names.size()) + ")");
    std::vector<std::string> gate_names, series_names;
    for (const GateSpec& g : layout.gates) gate_names.push_back(g.name);
    for (const SeriesSpec& s : layout.series) series_names.push_back(s.name);
    check_group_names("/gates", "gate", "gates", gate_names);
    check_group_names("/series", "series", "series", series_names);
    for (auto [l, h] : layout.dense_heads)
      if (l < 0 || l >= m.n_layers || h < 0 || h >= m.n_heads)
        fail("/attention/dense/heads", "(layer, head) out of range");
    if (layout.topk < 0 || layout.topk > 1024) fail("/attention/topk", "k must be 0..1024");
    if (layout.pooled_block < 0) fail("/attention/pooled", "block must be >= 0");
  }

  // Names become HDF5 group names under `group` (and paths in messages).
  void check_group_names(const std::string& group, const std::string& what,
                         const std::string& plural, const std::vector<std::string>& names) const {
    static const std::regex name_pattern("[A-Za-z0-9_-]{1,64}");
    for (size_t i = 0; i < names.size(); ++i) {
      if (!std::regex_match(names[i], name_pattern))
        fail(group + "/" + names[i], what + " names must match [A-Za-z0-9_-]{1,64}");
      if (std::find(names.begin(), names.begin() + long(i), names[i]) != names.begin() + long(i))
        fail(group + "/" + names[i], "declared twice (" + what + " names must be unique)");
    }
    if (names.size() > 64) fail(group, "at most 64 " + plural);
  }

  h5::Handle make_group(const std::string& group_path, const std::string& meaning) {
    fault_point();
    h5::Handle lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    h5::Handle g =
        h5::group(H5Gcreate2(file.get(), group_path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!g) throw TraceError(ErrorCode::Io, path, group_path, h5::take_error_message());
    if (!meaning.empty()) h5::write_attr_string(g.get(), "meaning", meaning);
    return g;
  }

  std::vector<hsize_t> chunk_shape(const DatasetSpec& spec, const std::vector<hsize_t>& fixed) {
    std::vector<hsize_t> chunk(spec.dims.size());
    size_t row_bytes = h5::elem_size(spec.elem);
    for (size_t i = 0; i < spec.dims.size(); ++i) {
      int64_t c = spec.chunk[i];
      hsize_t full = std::max<hsize_t>(1, fixed[i]);
      chunk[i] = c > 0 ? static_cast<hsize_t>(c) : full;
      if (c == 0 && static_cast<int>(i) != spec.append_axis) row_bytes *= full;
    }
    for (size_t i = 0; i < spec.dims.size(); ++i) {
      if (spec.chunk[i] == -1) {  // fill the chunk to ~256 KiB along this axis
        chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(4096, (256 * 1024) / row_bytes));
      } else if (spec.chunk[i] > 0 && static_cast<int>(i) != spec.append_axis &&
                 !axis_grows(spec.dims[i])) {
        chunk[i] = std::min<hsize_t>(chunk[i], std::max<hsize_t>(1, fixed[i]));
      }
    }
    return chunk;
  }

  void create_dataset(const DatasetSpec& spec) {
    fault_point();
    std::vector<hsize_t> dims, maxdims;
    for (size_t i = 0; i < spec.dims.size(); ++i) {
      Axis a = spec.dims[i];
      hsize_t n = axis_grows(a) ? 0 : static_cast<hsize_t>(axes[a]);
      dims.push_back(n);
      maxdims.push_back(axis_grows(a) ? H5S_UNLIMITED : n);
    }
    h5::Handle space =
        h5::dataspace(spec.dims.empty() ? H5Screate(H5S_SCALAR)
                                        : H5Screate_simple(static_cast<int>(dims.size()),
                                                           dims.data(), maxdims.data()));
    h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
    if (!spec.dims.empty()) {
      std::vector<hsize_t> chunk = chunk_shape(spec, dims);
      H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
      if (options.compression_level > 0 && spec.compress) {
        H5Pset_shuffle(dcpl.get());
        H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options.compression_level));
      }
    }
    set_fill(dcpl.get(), spec);
    h5::Handle lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    h5::Handle dapl = h5::plist(H5Pcreate(H5P_DATASET_ACCESS));
    if (!spec.compress && !spec.dims.empty()) {
      // Rewritten in place every flush across all heads: keep every chunk a
      // flush touches in the chunk cache instead of re-reading it from disk.
      size_t bytes = h5::elem_size(spec.elem);
      for (size_t i = 0; i < spec.dims.size(); ++i)
        if (!axis_grows(spec.dims[i])) bytes *= std::max<hsize_t>(1, dims[i]);
      bytes *= static_cast<size_t>(
          spec.chunk[static_cast<size_t>(spec.append_axis >= 0 ? spec.append_axis : 0)]);
      H5Pset_chunk_cache(dapl.get(), 12421, std::min<size_t>(bytes * 2, size_t(256) << 20), 1.0);
    }
    h5::Handle d = h5::dataset(H5Dcreate2(file.get(), spec.path.c_str(), h5::file_type(spec.elem),
                                          space.get(), lcpl.get(), dcpl.get(), dapl.get()));
    if (!d) throw TraceError(ErrorCode::Io, path, spec.path, h5::take_error_message());
    h5::write_attr_string(d.get(), "units", spec.units);
    h5::write_attr_string(d.get(), "meaning", spec.meaning);
    std::string axes_text;
    for (size_t i = 0; i < spec.dims.size(); ++i)
      axes_text += std::string(i ? "," : "") + axis_symbol(spec.dims[i]);
    h5::write_attr_string(d.get(), "axes", axes_text);

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

  static void set_fill(hid_t dcpl, const DatasetSpec& spec) {
    switch (spec.elem) {
      case Elem::F32: {
        float v = static_cast<float>(spec.fill);
        H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &v);
        break;
      }
      case Elem::F64: {
        double v = spec.fill;
        H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &v);
        break;
      }
      case Elem::F16: break;  // zero fill
      default: {
        int64_t v = static_cast<int64_t>(spec.fill);
        H5Pset_fill_value(dcpl, H5T_NATIVE_INT64, &v);
        break;
      }
    }
  }

  void write_run_attributes() {
    h5::Handle root = h5::group(H5Gopen2(file.get(), "/", H5P_DEFAULT));
    h5::write_attr_string(root.get(), "format", kFormatName);
    h5::write_attr_i64(root.get(), "version", kFormatVersion);
    h5::write_attr_i64(root.get(), "minor_version", kFormatMinorVersion);
    h5::write_attr_string(root.get(), "writer", std::string("kvscope ") + KVSCOPE_VERSION_STRING);
    h5::write_attr_string(root.get(), "created_utc", run.created_utc);

    h5::Handle g = h5::group(H5Gopen2(file.get(), "/run", H5P_DEFAULT));
    hid_t r = g.get();
    const ModelInfo& m = run.model;
    h5::write_attr_string(r, "model_name", m.name);
    h5::write_attr_string(r, "model_path", m.path);
    h5::write_attr_string(r, "model_sha256", m.sha256);
    h5::write_attr_string(r, "architecture", m.architecture);
    h5::write_attr_string(r, "dtype", m.dtype);
    h5::write_attr_string(r, "kv_dtype", m.kv_dtype);
    h5::write_attr_string(r, "device", m.device);
    h5::write_attr_i64(r, "n_layers", m.n_layers);
    h5::write_attr_i64(r, "n_heads", m.n_heads);
    h5::write_attr_i64(r, "n_kv_heads", m.n_kv_heads);
    h5::write_attr_i64(r, "head_dim", m.head_dim);
    h5::write_attr_i64(r, "vocab_size", m.vocab_size);
    h5::write_attr_i64(r, "context_length", m.context_length);
    // Minor version 9: each layer's attention window and FFN kind.
    const size_t L = static_cast<size_t>(m.n_layers);
    h5::write_attr_i64s(r, "layer_window",
                        m.layer_window.empty() ? std::vector<int64_t>(L, 0) : m.layer_window);
    h5::write_attr_strings(
        r, "layer_ffn", m.layer_ffn.empty() ? std::vector<std::string>(L, "dense") : m.layer_ffn);
    h5::write_attr_i64(r, "max_tokens", layout.max_tokens);
    h5::write_attr_string(r, "policy", run.policy);
    h5::write_attr_string(r, "policy_name", run.policy_name);
    h5::write_attr_string(r, "policy_params", run.policy_params_json);
    h5::write_attr_string(r, "budget_kind", run.budget_kind);
    h5::write_attr_i64(r, "budget", run.budget);
    h5::write_attr_i64(r, "seed", static_cast<int64_t>(run.seed));
    h5::write_attr_string(r, "prompt", run.prompt);
    h5::write_attr_string(r, "capture_levels", run.capture_levels);
    h5::write_attr_string(r, "command_line", run.command_line);
    h5::write_attr_string(r, "run_json", run.run_json);
    h5::write_attr_strings(r, "tier_names", run.tier_names);
    h5::write_attr_strings(r, "reason_names", run.reason_names);
    // Minor version 3: which tiers the policy's attention reads (empty: all).
    std::vector<uint8_t> attended = run.tier_attended;
    if (attended.empty()) attended.assign(run.tier_names.size(), 1);
    h5::write_attr_u8s(r, "tier_attended", attended);
    // Minor version 8: how each tier stored its rows.
    std::vector<std::string> formats = run.tier_formats;
    if (formats.empty()) formats.assign(run.tier_names.size(), "float32");
    h5::write_attr_strings(r, "tier_formats", formats);
    // Minor version 1: the gates the policy declared, so a validator knows
    // which /gates groups the file must hold.
    std::vector<std::string> gate_names;
    for (const GateSpec& g : layout.gates) gate_names.push_back(g.name);
    h5::write_attr_strings(r, "gate_names", gate_names);
    h5::write_attr_string(r, "tool_version", run.tool_version);
    h5::write_attr_string(r, "task_kind", run.task_kind);
    h5::write_attr_string(r, "expected_answer", run.expected_answer);
  }

  void write_layout_attributes() {
    if (layout.pooled_block > 0) {
      h5::Handle g = h5::group(H5Gopen2(file.get(), "/attention/pooled", H5P_DEFAULT));
      h5::write_attr_i64(g.get(), "block", layout.pooled_block);
      h5::write_attr_i64(g.get(), "key_blocks", axes[Axis::KeyBlocks]);
    }
    if (layout.topk > 0) {
      h5::Handle g = h5::group(H5Gopen2(file.get(), "/attention/topk", H5P_DEFAULT));
      h5::write_attr_i64(g.get(), "k", layout.topk);
    }
    if (layout.oracle) {
      h5::Handle g = h5::group(H5Gopen2(file.get(), "/oracle", H5P_DEFAULT));
      h5::write_attr_i64(g.get(), "recall_k", layout.oracle_recall_k);
    }
    if (!layout.dense_heads.empty()) {
      std::vector<int32_t> pairs;
      for (auto [l, h] : layout.dense_heads) {
        pairs.push_back(l);
        pairs.push_back(h);
      }
      H5Dwrite(datasets.at("/attention/dense/heads").get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL,
               H5P_DEFAULT, pairs.data());
    }
    {
      // Gate indices (GateValue::gate) follow this order, not HDF5's name order.
      std::vector<std::string> names;
      for (const GateSpec& gate : layout.gates) names.push_back(gate.name);
      h5::Handle g = h5::group(H5Gopen2(file.get(), "/gates", H5P_DEFAULT));
      h5::write_attr_strings(g.get(), "order", names);
    }
    for (const GateSpec& gate : layout.gates) {
      h5::Handle g = h5::group(H5Gopen2(file.get(), ("/gates/" + gate.name).c_str(), H5P_DEFAULT));
      h5::write_attr_string(g.get(), "meaning", gate.meaning);
      h5::write_attr_string(g.get(), "units", gate.units);
      h5::write_attr_f64(g.get(), "threshold", gate.threshold);
      h5::write_attr_i64(g.get(), "time_varying", gate.time_varying ? 1 : 0);
    }
    write_series_attributes();
  }

  void write_series_attributes() {
    if (layout.series.empty()) return;  // no /series group
    // Series indices (the blocks of StepData::series) follow this order.
    std::vector<std::string> names;
    for (const SeriesSpec& series : layout.series) names.push_back(series.name);
    h5::Handle g = h5::group(H5Gopen2(file.get(), "/series", H5P_DEFAULT));
    h5::write_attr_strings(g.get(), "order", names);
    for (const SeriesSpec& series : layout.series) {
      h5::Handle sg =
          h5::group(H5Gopen2(file.get(), ("/series/" + series.name).c_str(), H5P_DEFAULT));
      h5::write_attr_string(sg.get(), "meaning", series.meaning);
      h5::write_attr_string(sg.get(), "units", series.units);
    }
  }

  void write_scalar_u8(const char* dset_path, uint8_t value) {
    H5Dwrite(datasets.at(dset_path).get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value);
  }

  void create_file() {
    h5::silence_library_errors();
    check_run();
    if (run.created_utc.empty()) run.created_utc = utc_now();
    if (run.tool_version.empty()) run.tool_version = KVSCOPE_VERSION_STRING;
    L = run.model.n_layers;
    H = run.model.n_heads;
    K = run.model.n_kv_heads;
    R = static_cast<int64_t>(run.tier_names.size());
    axes = fixed_axis_sizes(run.model, layout, R);

    h5::Handle fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
    // SWMR needs the latest file format (superblock v3).
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    // The file is built under a temporary name and renamed once its
    // superblock, groups, datasets and /run are on disk, so the trace's own
    // path never names a file a reader cannot open, even if the capture is
    // killed while creating it (a killed creation leaves only `<path>.creating`).
    const std::string creating = path + ".creating";
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
    write_run_attributes();
    write_layout_attributes();
    write_scalar_u8("/run/complete", 0);
    int8_t no_success = -1;
    H5Dwrite(datasets.at("/generation/success").get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL,
             H5P_DEFAULT, &no_success);

    ev = {&col("/events/step"),   &col("/events/layer"),     &col("/events/kv_head"),
          &col("/events/token"),  &col("/events/kind"),      &col("/events/score"),
          &col("/events/reason"), &col("/events/from_tier"), &col("/events/to_tier")};
    stall_columns = {&col("/stalls/step"),  &col("/stalls/layer"),  &col("/stalls/kv_head"),
                     &col("/stalls/token"), &col("/stalls/wait_s"), &col("/stalls/needed")};
    merge_columns = {&col("/merges/step"),  &col("/merges/layer"), &col("/merges/kv_head"),
                     &col("/merges/token"), &col("/merges/into"),  &col("/merges/weight")};
    rerotation_columns = {&col("/rerotations/step"), &col("/rerotations/layer"),
                          &col("/rerotations/kv_head"), &col("/rerotations/token"),
                          &col("/rerotations/position")};
    reconstruction_columns = {&col("/reconstruction/step"), &col("/reconstruction/position"),
                              &col("/reconstruction/id")};
    key_channel_columns = {&col("/key_channels/step"), &col("/key_channels/layer"),
                           &col("/key_channels/kv_head"), &col("/key_channels/channel")};
    admit.init(take_dataset("/lifetimes/admit_step"), Elem::I32, L * K, -1);
    evict.init(take_dataset("/lifetimes/evict_step"), Elem::I32, L * K, -1);
    for (const SeriesSpec& sp : layout.series)
      series_columns.push_back(&columns.at("/series/" + sp.name + "/value"));
    series_nan_row.assign(static_cast<size_t>(L * K), std::numeric_limits<float>::quiet_NaN());
    for (const GateSpec& g : layout.gates) {
      gate_values.emplace_back();
      gate_values.back().init(take_dataset("/gates/" + g.name + "/value"), Elem::F32, L * K,
                              std::numeric_limits<float>::quiet_NaN());
    }
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

  void check_head(const char* field, int64_t layer, int64_t kv_head) const {
    if (layer < 0 || layer >= L || kv_head < 0 || kv_head >= K)
      fail(field, "layer/kv_head (" + std::to_string(layer) + ", " + std::to_string(kv_head) +
                      ") outside " + std::to_string(L) + " x " + std::to_string(K));
  }

  // What every row of a step (an event, a stall) must name: that step, a head
  // and a token already fed. `group` is "/events" or "/stalls", `noun` the row.
  void check_step_row(const std::string& group, const char* noun, int64_t row_step, int32_t step,
                      int64_t layer, int64_t kv_head, int64_t token) const {
    if (row_step != step)
      fail(group + "/step", std::string(noun) + " for step " + std::to_string(row_step) +
                                " appended in step " + std::to_string(step));
    check_head((group + "/layer").c_str(), layer, kv_head);
    if (token < 0 || token >= tokens_appended)
      fail(group + "/token", "token " + std::to_string(token) + " not yet fed (" +
                                 std::to_string(tokens_appended) + " tokens)");
  }

  void append(const StepData& sd) {
    if (closed) fail("", "append_step after close");
    const int32_t step = static_cast<int32_t>(steps_appended);
    append_tokens(sd, step);
    StepRecord rec = sd.step;
    rec.event_begin = events_appended;
    rec.event_count = static_cast<int64_t>(sd.events.size());
    append_events(sd.events, step);
    append_occupancy(sd);
    if (layout.received) append_received(sd);
    for (const PooledRow& row : sd.pooled) queue_pooled(row);
    for (const DenseRow& row : sd.dense) queue_dense(row);
    if (layout.topk > 0) append_topk(sd);
    for (const GateValue& g : sd.gates) set_gate(g, step);
    if (!layout.series.empty()) append_series(sd);
    append_stalls(sd.stalls, step);
    append_merges(sd.merges, step);
    append_rerotations(sd.rerotations, step);
    append_key_channels(sd.key_channels, step);
    append_reconstruction(sd, step);
    if (layout.oracle) append_oracle(sd);
    if (!sd.generated_text.empty())
      col("/generation/text_bytes")
          .push(reinterpret_cast<const uint8_t*>(sd.generated_text.data()),
                sd.generated_text.size());

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

    double since =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush).count();
    if (steps_since_flush >= options.flush_every_steps || since >= options.flush_every_seconds)
      flush_all();
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
    admit.grow_to(tokens_appended);
    evict.grow_to(tokens_appended);
    for (auto& g : gate_values) g.grow_to(tokens_appended);
  }

  void append_events(const std::vector<Event>& events, int32_t step) {
    for (const Event& e : events) {
      check_step_row("/events", "event", e.step, step, e.layer, e.kv_head, e.token);
      if (static_cast<int>(e.kind) >= kEventKindCount) fail("/events/kind", "unknown kind");
      if (e.reason >= run.reason_names.size()) fail("/events/reason", "outside reason_names");
      if ((e.from_tier != kNoTier && e.from_tier >= R) || (e.to_tier != kNoTier && e.to_tier >= R))
        fail("/events/from_tier", "tier outside tier_names");
      ev.step->push1(e.step);
      ev.layer->push1(e.layer);
      ev.kv_head->push1(e.kv_head);
      ev.token->push1(e.token);
      ev.kind->push1(static_cast<uint8_t>(e.kind));
      ev.score->push1(e.score);
      ev.reason->push1(e.reason);
      ev.from_tier->push1(e.from_tier);
      ev.to_tier->push1(e.to_tier);
      ++events_appended;
      track_lifetime(e);
    }
  }

  // Lifetimes are derived from events here, once, so the trace cannot hold a
  // lifetime that contradicts its events.
  void track_lifetime(const Event& e) {
    int64_t slot = int64_t(e.layer) * K + e.kv_head;
    switch (e.kind) {
      case EventKind::Admit:
        admit.set(slot, e.token, e.step);
        open_interval(slot, e, e.to_tier == kNoTier ? 0 : e.to_tier);
        break;
      case EventKind::Evict:
        evict.set(slot, e.token, e.step);
        close_interval(slot, e.token, e.step);
        break;
      case EventKind::Demote:
      case EventKind::Promote:
        close_interval(slot, e.token, e.step);
        open_interval(slot, e, e.to_tier);
        break;
      case EventKind::Reject:
      case EventKind::Select: break;
    }
  }

  void open_interval(int64_t slot, const Event& e, uint8_t tier) {
    if (R <= 1) return;
    TierInterval iv{e.layer, e.kv_head, e.token, tier, e.step, -1};
    open_intervals[(slot << 32) | static_cast<uint32_t>(e.token)] = iv;
  }

  void close_interval(int64_t slot, int32_t token, int32_t step) {
    if (R <= 1) return;
    auto it = open_intervals.find((slot << 32) | static_cast<uint32_t>(token));
    if (it == open_intervals.end()) return;
    it->second.end_step = step;
    closed_intervals.push_back(it->second);
    open_intervals.erase(it);
  }

  void append_occupancy(const StepData& sd) {
    if (static_cast<int64_t>(sd.occupancy.size()) != L * K * R)
      fail("/occupancy/entries", "step carries " + std::to_string(sd.occupancy.size()) +
                                     " values, expected L*K*R = " + std::to_string(L * K * R));
    col("/occupancy/entries").push(sd.occupancy.data(), 1);
    std::vector<int64_t> bytes = sd.tier_bytes;
    bytes.resize(static_cast<size_t>(R), 0);
    col("/occupancy/tier_bytes").push(bytes.data(), 1);
  }

  // One [L, K] row per series and step; a step that carries no values gets
  // NaN rows, so every series keeps one row per step.
  void append_series(const StepData& sd) {
    const size_t per_series = static_cast<size_t>(L * K);
    const size_t want = layout.series.size() * per_series;
    if (!sd.series.empty() && sd.series.size() != want)
      fail("/series", "step carries " + std::to_string(sd.series.size()) +
                          " values, expected series * L * K = " + std::to_string(want) +
                          " (or none)");
    for (size_t i = 0; i < series_columns.size(); ++i)
      series_columns[i]->push(
          sd.series.empty() ? series_nan_row.data() : sd.series.data() + i * per_series, 1);
  }

  // Stalls are rows of the step like its events; /steps commits them.
  void append_stalls(const std::vector<StallRow>& stalls, int32_t step) {
    for (const StallRow& s : stalls) {
      check_step_row("/stalls", "stall", s.step, step, s.layer, s.kv_head, s.token);
      if (!std::isfinite(s.wait_s) || s.wait_s < 0)
        fail("/stalls/wait_s", "is " + number_text(s.wait_s) + " s (expected finite and >= 0)");
      if (s.needed < -1 || s.needed > 1)
        fail("/stalls/needed", "is " + std::to_string(s.needed) + " (expected -1, 0 or 1)");
      stall_columns.step->push1(s.step);
      stall_columns.layer->push1(s.layer);
      stall_columns.kv_head->push1(s.kv_head);
      stall_columns.token->push1(s.token);
      stall_columns.wait_s->push1(s.wait_s);
      stall_columns.needed->push1(s.needed);
    }
  }

  // A reconstruction step feeds no sequence tokens; its own tokens are rows
  // of /reconstruction, and only such a step has them.
  void append_reconstruction(const StepData& sd, int32_t step) {
    const bool kind = sd.step.kind == StepKind::Reconstruction;
    if (kind && sd.step.first_token != tokens_appended)
      fail("/steps/first_token", "a reconstruction step starts at the next sequence token " +
                                     std::to_string(tokens_appended));
    if (kind && (sd.step.n_tokens != 0 || sd.reconstruction.empty()))
      fail("/reconstruction",
           "a reconstruction step feeds no sequence tokens and at least one "
           "reconstruction token");
    if (!kind && !sd.reconstruction.empty())
      fail("/reconstruction", "step " + std::to_string(step) +
                                  " carries reconstruction tokens but is no reconstruction step");
    for (size_t i = 0; i < sd.reconstruction.size(); ++i) {
      const ReconstructionRow& r = sd.reconstruction[i];
      if (r.step != step)
        fail("/reconstruction/step", "row for step " + std::to_string(r.step) +
                                         " appended in step " + std::to_string(step));
      if (r.position != sd.step.first_token + int32_t(i))
        fail("/reconstruction/position", "is " + std::to_string(r.position) + " (expected " +
                                             std::to_string(sd.step.first_token + int32_t(i)) +
                                             ")");
      if (r.id < 0 || r.id >= run.model.vocab_size)
        fail("/reconstruction/id", "id " + std::to_string(r.id) + " outside the vocabulary");
      reconstruction_columns.step->push1(r.step);
      reconstruction_columns.position->push1(r.position);
      reconstruction_columns.id->push1(r.id);
    }
  }

  // Merges are rows of the step like its events; /steps commits them.
  void append_merges(const std::vector<MergeRow>& merges, int32_t step) {
    for (const MergeRow& m : merges) {
      check_step_row("/merges", "merge", m.step, step, m.layer, m.kv_head, m.token);
      if (m.into < 0 || m.into >= tokens_appended || m.into == m.token)
        fail("/merges/into", "token " + std::to_string(m.into) + " for entry " +
                                 std::to_string(m.token) + " (expected another token already fed)");
      if (!std::isfinite(m.weight) || m.weight < 0)
        fail("/merges/weight", "is " + number_text(m.weight) + " (expected finite and >= 0)");
      merge_columns.step->push1(m.step);
      merge_columns.layer->push1(m.layer);
      merge_columns.kv_head->push1(m.kv_head);
      merge_columns.token->push1(m.token);
      merge_columns.into->push1(m.into);
      merge_columns.weight->push1(m.weight);
    }
  }

  // Re-rotations are rows of the step like its events; /steps commits them.
  void append_rerotations(const std::vector<RerotationRow>& rows, int32_t step) {
    for (const RerotationRow& r : rows) {
      check_step_row("/rerotations", "re-rotation", r.step, step, r.layer, r.kv_head, r.token);
      if (r.position < 0 || r.position > r.token)
        fail("/rerotations/position", "position " + std::to_string(r.position) + " for token " +
                                          std::to_string(r.token) +
                                          " (expected 0 .. the token's own position)");
      rerotation_columns.step->push1(r.step);
      rerotation_columns.layer->push1(r.layer);
      rerotation_columns.kv_head->push1(r.kv_head);
      rerotation_columns.token->push1(r.token);
      rerotation_columns.position->push1(r.position);
    }
  }

  // Pruned key channels are rows of the step like its events; /steps commits them.
  void append_key_channels(const std::vector<KeyChannelRow>& rows, int32_t step) {
    for (const KeyChannelRow& r : rows) {
      check_step_row("/key_channels", "pruned key channel", r.step, step, r.layer, r.kv_head, 0);
      if (r.channel < 0 || r.channel >= run.model.head_dim)
        fail("/key_channels/channel",
             "channel " + std::to_string(r.channel) +
                 " (expected 0 .. head_dim - 1 = " + std::to_string(run.model.head_dim - 1) + ")");
      key_channel_columns.step->push1(r.step);
      key_channel_columns.layer->push1(r.layer);
      key_channel_columns.kv_head->push1(r.kv_head);
      key_channel_columns.channel->push1(r.channel);
    }
  }

  void append_received(const StepData& sd) {
    std::vector<int64_t> offset(static_cast<size_t>(L * K), received_rows_appended);
    std::vector<int32_t> count(static_cast<size_t>(L * K), 0);
    AppendColumn& tok = col("/attention/received/token");
    AppendColumn& mass = col("/attention/received/mass");
    for (const ReceivedRow& row : sd.received) {
      check_head("/attention/received", row.layer, row.kv_head);
      if (row.tokens.size() != row.mass.size())
        fail("/attention/received/mass", "tokens and mass differ in length");
      size_t slot = static_cast<size_t>(row.layer * K + row.kv_head);
      offset[slot] = received_rows_appended;
      count[slot] = static_cast<int32_t>(row.tokens.size());
      tok.push(row.tokens.data(), row.tokens.size());
      mass.push(row.mass.data(), row.mass.size());
      received_rows_appended += static_cast<int64_t>(row.tokens.size());
    }
    col("/attention/received/offset").push(offset.data(), 1);
    col("/attention/received/count").push(count.data(), 1);
  }

  void queue_pooled(const PooledRow& row) {
    if (layout.pooled_block <= 0) fail("/attention/pooled", "layout has no pooled level");
    int64_t kb = axes[Axis::KeyBlocks];
    if (row.layer < 0 || row.layer >= L) fail("/attention/pooled", "layer out of range");
    if (row.query_block < 0 || row.query_block >= kb)
      fail("/attention/pooled", "query block out of range");
    if (static_cast<int64_t>(row.max.size()) != H * kb ||
        static_cast<int64_t>(row.mean.size()) != H * kb)
      fail("/attention/pooled", "row must hold H * key_blocks values");
    pending_pooled[{row.layer, row.query_block}] = row;
  }

  void queue_dense(const DenseRow& row) {
    if (row.head_index < 0 || row.head_index >= static_cast<int32_t>(layout.dense_heads.size()))
      fail("/attention/dense/weight", "head index out of range");
    if (row.token < 0 || row.token >= tokens_appended)
      fail("/attention/dense/weight", "query token not yet fed");
    if (static_cast<int64_t>(row.weight.size()) != layout.max_tokens)
      fail("/attention/dense/weight", "row must hold max_tokens values");
    pending_dense.push_back(row);
  }

  void append_topk(const StepData& sd) {
    int64_t k = layout.topk;
    for (const TopkRow& row : sd.topk) {
      if (row.token != topk_rows_appended)
        fail("/attention/topk/index", "rows must arrive in token order; expected token " +
                                          std::to_string(topk_rows_appended));
      if (static_cast<int64_t>(row.index.size()) != L * H * k ||
          static_cast<int64_t>(row.weight.size()) != L * H * k)
        fail("/attention/topk/index", "row must hold L * H * k values");
      col("/attention/topk/index").push(row.index.data(), 1);
      col("/attention/topk/weight").push(row.weight.data(), 1);
      ++topk_rows_appended;
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

  void append_oracle(const StepData& sd) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> lost(static_cast<size_t>(L * H), nan),
        recall(static_cast<size_t>(L * K), nan);
    float kl = nan;
    if (sd.has_oracle) {
      if (static_cast<int64_t>(sd.oracle.lost_mass.size()) != L * H ||
          static_cast<int64_t>(sd.oracle.recall.size()) != L * K)
        fail("/oracle", "lost_mass must hold L*H and recall L*K values");
      lost = sd.oracle.lost_mass;
      recall = sd.oracle.recall;
      kl = sd.oracle.kl;
    }
    col("/oracle/kl").push1(kl);
    col("/oracle/lost_mass").push(lost.data(), 1);
    col("/oracle/recall").push(recall.data(), 1);
  }

  // ---- flushing -------------------------------------------------------------

  void io_fail(const std::string& field) const {
    throw TraceError(ErrorCode::Io, path, field, h5::take_error_message());
  }

  void write_column(AppendColumn& c) {
    fault_point();
    size_t rows = c.pending_rows();
    if (rows == 0) return;
    std::vector<hsize_t> dims = h5::extent(c.dset.get());
    hsize_t start0 = c.rows_on_disk;
    dims[0] = start0 + rows;
    if (H5Dset_extent(c.dset.get(), dims.data()) < 0) io_fail(c.path);
    h5::Handle fspace = h5::dataspace(H5Dget_space(c.dset.get()));
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = start0;
    count[0] = rows;
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    h5::Handle mspace =
        h5::dataspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
    if (H5Dwrite(c.dset.get(), h5::memory_type(c.elem), mspace.get(), fspace.get(), H5P_DEFAULT,
                 c.pending.data()) < 0)
      io_fail(c.path);
    c.rows_on_disk = dims[0];
    c.pending.clear();
  }

  template <typename T>
  void write_head_token_array(HeadTokenArray<T>& a, const char* field) {
    fault_point();
    std::vector<hsize_t> dims = h5::extent(a.dset.get());
    if (dims[2] < static_cast<hsize_t>(a.tokens)) {
      dims[2] = static_cast<hsize_t>(a.tokens);
      if (H5Dset_extent(a.dset.get(), dims.data()) < 0) io_fail(field);
    }
    h5::Handle fspace = h5::dataspace(H5Dget_space(a.dset.get()));
    for (int64_t slot = 0; slot < a.slots; ++slot) {
      DirtyRange& d = a.dirty[static_cast<size_t>(slot)];
      if (d.empty()) continue;
      hsize_t start[3] = {hsize_t(slot / K), hsize_t(slot % K), hsize_t(d.lo)};
      hsize_t count[3] = {1, 1, hsize_t(d.hi - d.lo)};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::Handle mspace = h5::dataspace(H5Screate_simple(1, &count[2], nullptr));
      if (H5Dwrite(a.dset.get(), h5::memory_type(a.elem), mspace.get(), fspace.get(), H5P_DEFAULT,
                   &a.at(slot, d.lo)) < 0)
        io_fail(field);
      d.clear();
    }
  }

  void write_intervals(const std::vector<TierInterval>& rows, size_t from) {
    fault_point();
    for (size_t i = from; i < rows.size(); ++i) {
      const TierInterval& iv = rows[i];
      col("/lifetimes/intervals/layer").push1(iv.layer);
      col("/lifetimes/intervals/kv_head").push1(iv.kv_head);
      col("/lifetimes/intervals/token").push1(iv.token);
      col("/lifetimes/intervals/tier").push1(iv.tier);
      col("/lifetimes/intervals/begin_step").push1(iv.begin_step);
      col("/lifetimes/intervals/end_step").push1(iv.end_step);
    }
  }

  void write_pooled() {
    fault_point();
    if (pending_pooled.empty()) return;
    h5::Handle& dmax = datasets.at("/attention/pooled/max");
    h5::Handle& dmean = datasets.at("/attention/pooled/mean");
    hsize_t kb = static_cast<hsize_t>(axes[Axis::KeyBlocks]);
    hsize_t need = pooled_blocks_on_disk;
    for (auto& [key, row] : pending_pooled) need = std::max<hsize_t>(need, hsize_t(key.second) + 1);
    if (need > pooled_blocks_on_disk) {
      hsize_t dims[4] = {hsize_t(L), hsize_t(H), need, kb};
      if (H5Dset_extent(dmax.get(), dims) < 0 || H5Dset_extent(dmean.get(), dims) < 0)
        io_fail("/attention/pooled");
      pooled_blocks_on_disk = need;
    }
    std::vector<uint16_t> half;
    for (auto& [key, row] : pending_pooled) {
      // Keys never come after the queries of the block: write key blocks
      // 0..qb only, so chunks above the diagonal are never allocated.
      hsize_t nk = std::min<hsize_t>(kb, hsize_t(key.second) + 1);
      hsize_t start[4] = {hsize_t(key.first), 0, hsize_t(key.second), 0};
      hsize_t count[4] = {1, hsize_t(H), 1, nk};
      half.resize(static_cast<size_t>(H * nk));
      for (int which = 0; which < 2; ++which) {
        const std::vector<float>& src = which == 0 ? row.max : row.mean;
        h5::Handle& d = which == 0 ? dmax : dmean;
        for (hsize_t h = 0; h < hsize_t(H); ++h)
          for (hsize_t k = 0; k < nk; ++k) half[h * nk + k] = float_to_half(src[h * kb + k]);
        h5::Handle fspace = h5::dataspace(H5Dget_space(d.get()));
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
        h5::Handle mspace = h5::dataspace(H5Screate_simple(4, count, nullptr));
        if (H5Dwrite(d.get(), h5::memory_type(Elem::F16), mspace.get(), fspace.get(), H5P_DEFAULT,
                     half.data()) < 0)
          io_fail("/attention/pooled");
      }
    }
    pending_pooled.clear();
  }

  void write_dense() {
    fault_point();
    if (pending_dense.empty()) return;
    h5::Handle& d = datasets.at("/attention/dense/weight");
    hsize_t need = dense_tokens_on_disk;
    for (const DenseRow& row : pending_dense)
      need = std::max<hsize_t>(need, hsize_t(row.token) + 1);
    hsize_t m = static_cast<hsize_t>(layout.max_tokens);
    if (need > dense_tokens_on_disk) {
      hsize_t dims[3] = {hsize_t(layout.dense_heads.size()), need, m};
      if (H5Dset_extent(d.get(), dims) < 0) io_fail("/attention/dense/weight");
      dense_tokens_on_disk = need;
    }
    h5::Handle fspace = h5::dataspace(H5Dget_space(d.get()));
    h5::Handle mspace = h5::dataspace(H5Screate_simple(1, &m, nullptr));
    for (const DenseRow& row : pending_dense) {
      hsize_t start[3] = {hsize_t(row.head_index), hsize_t(row.token), 0};
      hsize_t count[3] = {1, 1, m};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      if (H5Dwrite(d.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT,
                   row.weight.data()) < 0)
        io_fail("/attention/dense/weight");
    }
    pending_dense.clear();
  }

  void flush_all() {
    // Everything a step refers to goes first; /steps last, so that a reader
    // (or a crash) never exposes a step whose data is not on disk.
    for (auto& [p, c] : columns)
      if (p.rfind("/steps/", 0) != 0) write_column(c);  // NOLINT
    write_head_token_array(admit, "/lifetimes/admit_step");
    write_head_token_array(evict, "/lifetimes/evict_step");
    for (size_t g = 0; g < gate_values.size(); ++g)
      write_head_token_array(gate_values[g], "/gates/value");
    if (R > 1) {
      write_intervals(closed_intervals, closed_intervals_on_disk);
      closed_intervals_on_disk = closed_intervals.size();
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
    write_scalar_u8("/generation/finish_reason", reason);
    int8_t success = summary.success;
    H5Dwrite(datasets.at("/generation/success").get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL,
             H5P_DEFAULT, &success);
    double score = summary.score;
    H5Dwrite(datasets.at("/generation/score").get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
             H5P_DEFAULT, &score);
    write_scalar_u8("/run/complete", 1);
    fault_point();
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) io_fail("");
    close_file();
  }

  // Rewrites all intervals sorted by (layer, kv_head, token, begin) and the
  // per-head index, so a reader fetches one head's intervals with one read.
  void finalize_intervals() {
    std::vector<TierInterval> all = closed_intervals;
    for (auto& [key, iv] : open_intervals) all.push_back(iv);
    std::sort(all.begin(), all.end(), [](const TierInterval& a, const TierInterval& b) {
      return std::tie(a.layer, a.kv_head, a.token, a.begin_step) <
             std::tie(b.layer, b.kv_head, b.token, b.begin_step);
    });
    std::vector<int64_t> index(static_cast<size_t>(L * K + 1), 0);
    for (const TierInterval& iv : all) ++index[static_cast<size_t>(iv.layer * K + iv.kv_head) + 1];
    for (size_t i = 1; i < index.size(); ++i) index[i] += index[i - 1];
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
    admit.dset.reset();
    evict.dset.reset();
    for (auto& g : gate_values) g.dset.reset();
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
