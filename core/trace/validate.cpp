#include "core/trace/validate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/trace/h5.h"
#include "core/trace/half.h"
#include "core/trace/open.h"
#include "core/trace/row_tables.h"
#include "core/trace/schema.h"

namespace kvscope::trace {

namespace {

constexpr hsize_t kScanBlockBytes = 8u << 20;  // values are checked 8 MiB at a time

std::string range_text(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " +
         (hi == INT64_MAX ? std::string("+inf") : std::to_string(hi)) + ")";
}

class Validator {
 public:
  explicit Validator(std::string path, const void* image = nullptr, size_t image_size = 0)
      : path_(std::move(path)), image_(image), image_size_(image_size) {}

  ValidationReport run() {
    try {
      opened_ = image_ ? open_trace_image(path_, image_, image_size_) : open_trace_file(path_);
    } catch (const TraceError& e) {
      report_.violations.push_back({e.field().empty() ? "/" : e.field(), strip_prefix(e)});
      return report_;
    }
    report_.opened = true;
    file_ = opened_.file.get();
    std::vector<Problem> problems;
    read_run_info(file_, &run_, &layout_, &problems);
    for (const Problem& p : problems) add(p.field, p.message);
    if (!problems.empty()) return report_;
    check_root_attributes();
    R_ = static_cast<int64_t>(run_.tier_names.size());
    has_reconstruction_ = opened_.minor_version >= 5;
    specs_ = datasets_for(layout_, R_, opened_.minor_version);
    check_complete_flag();
    measure_growth_axes();
    for (const DatasetSpec& spec : specs_) check_dataset(spec);
    check_series_attributes();
    if (report_.violations.empty()) check_values();
    return report_;
  }

 private:
  std::string path_;
  const void* image_ = nullptr;  // a file image in memory instead of the file at path_
  size_t image_size_ = 0;
  OpenedTrace opened_;
  hid_t file_ = -1;
  RunInfo run_;
  CaptureLayout layout_;
  int64_t R_ = 1;
  bool has_reconstruction_ = false;  // minor version 5: step kind 2 and /reconstruction
  std::vector<DatasetSpec> specs_;
  AxisSizes sizes_;  // the sizes every dataset must have (complete) or reach (incomplete)
  std::map<std::string, AxisSizes> gate_sizes_;
  bool complete_ = false;
  ValidationReport report_;
  std::map<std::string, h5::Handle> handles_;

  std::string strip_prefix(const TraceError& e) const {
    std::string m = e.what();
    std::string prefix = e.file() + (e.field().empty() ? "" : ": " + e.field()) + ": ";
    return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
  }

  void add(const std::string& field, const std::string& message) {
    report_.violations.push_back({field, message});
  }

  hid_t open(const std::string& p) {
    auto it = handles_.find(p);
    if (it != handles_.end()) return it->second.get();
    if (!h5::link_exists(file_, p)) return -1;
    h5::Handle d = h5::dataset(H5Dopen2(file_, p.c_str(), H5P_DEFAULT));
    if (!d) {
      H5Eclear2(H5E_DEFAULT);
      return -1;
    }
    hid_t id = d.get();
    handles_.emplace(p, std::move(d));
    return id;
  }

  int64_t extent0(const std::string& p) {
    hid_t d = open(p);
    if (d < 0) return 0;
    std::vector<hsize_t> e = h5::extent(d);
    return e.empty() ? 0 : static_cast<int64_t>(e[0]);
  }

  template <typename T>
  std::vector<T> read_rows(const std::string& p, hsize_t begin, hsize_t end, hid_t mem = -1) {
    hid_t d = open(p);
    std::vector<hsize_t> e = d < 0 ? std::vector<hsize_t>{} : h5::extent(d);
    if (e.empty() || end > e[0] || begin > end) {
      add(p, "cannot read rows " + std::to_string(begin) + ".." + std::to_string(end));
      return {};
    }
    std::vector<hsize_t> start(e.size(), 0), count = e;
    start[0] = begin;
    count[0] = end - begin;
    size_t n = 1;
    for (hsize_t c : count) n *= static_cast<size_t>(c);
    std::vector<T> out(n);
    if (n == 0) return out;
    h5::Handle fs = h5::dataspace(H5Dget_space(d));
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    h5::Handle ms =
        h5::dataspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
    hid_t mt = mem;
    if (mt < 0) {
      if (std::is_same<T, float>::value)
        mt = H5T_NATIVE_FLOAT;
      else if (std::is_same<T, double>::value)
        mt = H5T_NATIVE_DOUBLE;
      else
        mt = H5T_NATIVE_INT64;
    }
    if (H5Dread(d, mt, ms.get(), fs.get(), H5P_DEFAULT, out.data()) < 0) {
      add(p, "read failed: " + h5::take_error_message());
      return {};
    }
    return out;
  }

  // Row `row` of a 1-D integer column, when the column exists, is that long
  // and reads (a failed read is reported by read_rows).
  bool value_at(const std::string& p, int64_t row, int64_t* out) {
    if (open(p) < 0 || extent0(p) <= row) return false;
    std::vector<int64_t> v =
        read_rows<int64_t>(p, static_cast<hsize_t>(row), static_cast<hsize_t>(row) + 1);
    if (v.size() != 1) return false;
    *out = v[0];
    return true;
  }

  template <typename T>
  T read_scalar(const std::string& p) {
    hid_t d = open(p);
    T v{};
    hid_t mt = std::is_same<T, int64_t>::value ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE;
    if (d < 0 || H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return T{-1};
    }
    return v;
  }

  // Calls fn(first_row, rows) over axis 0 of p in blocks of about 8 MiB.
  template <typename T>
  void scan(const std::string& p, int64_t rows,
            const std::function<void(int64_t, const std::vector<T>&)>& fn, hid_t mem = -1) {
    hid_t d = open(p);
    if (d < 0 || rows <= 0) return;
    std::vector<hsize_t> e = h5::extent(d);
    hsize_t row_elems = 1;
    for (size_t i = 1; i < e.size(); ++i) row_elems *= e[i];
    hsize_t block =
        std::max<hsize_t>(1, kScanBlockBytes / (sizeof(T) * std::max<hsize_t>(1, row_elems)));
    for (hsize_t b = 0; b < static_cast<hsize_t>(rows); b += block) {
      hsize_t end = std::min<hsize_t>(static_cast<hsize_t>(rows), b + block);
      std::vector<T> values = read_rows<T>(p, b, end, mem);
      if (values.empty() && end > b) return;
      fn(static_cast<int64_t>(b), values);
    }
  }

  void check_root_attributes() {
    hid_t root = file_;
    std::string s;
    int64_t v;
    if (!h5::read_attr_i64(root, "minor_version", &v))
      add("/ attribute minor_version", "missing or not an integer");
    else if (v < 0 || v > 65535)
      add("/ attribute minor_version", "is " + std::to_string(v) + " (expected 0..65535)");
    std::string why;
    if (!h5::read_attr_string(root, "writer", &s, &why)) add("/ attribute writer", why);
    if (!h5::read_attr_string(root, "created_utc", &s, &why)) add("/ attribute created_utc", why);
  }

  void check_complete_flag() {
    hid_t d = open("/run/complete");
    if (d < 0) return;  // reported with the datasets
    int64_t v = read_scalar<int64_t>("/run/complete");
    if (v != 0 && v != 1) add("/run/complete", "is " + std::to_string(v) + " (expected 0 or 1)");
    complete_ = v == 1;
    report_.complete = complete_;
  }

  // Growth axes: owner datasets define the lengths every other dataset on the
  // same axis must have. In an incomplete trace only committed rows (those of
  // steps on disk) must be present.
  void measure_growth_axes() {
    sizes_ = fixed_axis_sizes(run_.model, layout_, R_);
    int64_t S = extent0("/steps/kind");
    int64_t T = extent0("/tokens/id");
    int64_t E = extent0("/events/step");
    if (!complete_ && S > 0) {
      // The committed lengths are where the last committed step ends; a
      // column that cannot be read leaves the extents (and its own report).
      int64_t first = 0, n = 0, begin = 0, count = 0;
      if (value_at("/steps/first_token", S - 1, &first) && value_at("/steps/n_tokens", S - 1, &n))
        T = first + n;
      if (value_at("/steps/event_begin", S - 1, &begin) &&
          value_at("/steps/event_count", S - 1, &count))
        E = begin + count;
    }
    sizes_[Axis::Steps] = S;
    sizes_[Axis::Tokens] = T;
    sizes_.table_rows[table_of<Event>().group] = E;
    sizes_[Axis::TextBytes] = extent0("/tokens/text_bytes");
    sizes_.table_rows[table_of<TierInterval>().group] =
        R_ > 1 ? committed_rows("/lifetimes/intervals/end_step", S)
               : extent0("/lifetimes/intervals/layer");
    sizes_[Axis::ReceivedRows] = committed_received_rows(S);
    sizes_[Axis::GenBytes] = extent0("/generation/text_bytes");
    for (const RowTableSpec* t : step_tables())
      if (holds(*t)) sizes_.table_rows[t->group] = committed_rows(t->group + "/step", S);
    int64_t b = layout_.pooled_block;
    sizes_[Axis::QueryBlocks] = b > 0 ? (T + b - 1) / b : 0;
    for (const GateSpec& g : layout_.gates) {
      AxisSizes s = sizes_;
      s[Axis::GateSamples] = g.time_varying
                                 ? committed_rows("/gates/" + g.name + "/samples/step", S)
                                 : extent0("/gates/" + g.name + "/samples/step");
      gate_sizes_[g.name] = s;
    }
    report_.n_steps = S;
    report_.n_tokens = T;
    report_.n_events = E;
  }

  // Whether a trace of this minor version holds the table.
  bool holds(const RowTableSpec& t) const { return opened_.minor_version >= t.since_minor; }

  // Rows of a step table (/stalls, /merges; `step` its step column): all of
  // them in a complete trace; in an incomplete one those before the first row
  // of a step not committed (a flush writes the rows of its steps before it
  // commits them).
  int64_t committed_rows(const std::string& step, int64_t S) {
    const int64_t rows = extent0(step);
    if (complete_) return rows;
    int64_t n = 0;
    bool done = false;
    scan<int64_t>(step, rows, [&](int64_t, const std::vector<int64_t>& v) {
      for (size_t i = 0; i < v.size() && !done; ++i) {
        done = v[i] >= S;
        if (!done) ++n;
      }
    });
    return n;
  }

  // Rows of /attention/received: all in a complete trace; in an incomplete
  // one those up to the end of the last committed step's rows (a flush
  // writes the rows of its steps before it commits them).
  int64_t committed_received_rows(int64_t S) {
    const int64_t rows = extent0("/attention/received/token");
    if (complete_ || !layout_.received) return rows;
    if (S == 0) return 0;
    auto off = read_rows<int64_t>("/attention/received/offset", S - 1, S);
    auto cnt = read_rows<int64_t>("/attention/received/count", S - 1, S);
    if (off.empty() || off.size() != cnt.size()) return rows;  // its own report
    int64_t end = 0;
    for (size_t i = 0; i < off.size(); ++i)
      end = std::max(end, off[i] + std::max<int64_t>(0, cnt[i]));
    return std::min(rows, end);
  }

  const AxisSizes& sizes_for(const std::string& p) {
    if (p.rfind("/gates/", 0) == 0) {
      std::string name = p.substr(7, p.find('/', 7) - 7);
      auto it = gate_sizes_.find(name);
      if (it != gate_sizes_.end()) return it->second;
    }
    return sizes_;
  }

  void check_dataset(const DatasetSpec& spec) {
    const std::string& p = spec.path;
    if (!h5::link_exists(file_, p)) {
      add(p, "dataset missing");
      return;
    }
    H5O_info_t info;
    if (H5Oget_info_by_name(file_, p.c_str(), &info, H5P_DEFAULT) < 0 ||
        info.type != H5O_TYPE_DATASET) {
      H5Eclear2(H5E_DEFAULT);
      add(p, "is not a dataset");
      return;
    }
    hid_t d = open(p);
    if (d < 0) {
      add(p, "cannot be opened");
      return;
    }
    h5::Handle type = h5::datatype(H5Dget_type(d));
    Elem found;
    if (!h5::classify_type(type.get(), &found) || found != spec.elem) {
      add(p, std::string("element type is ") +
                 (h5::classify_type(type.get(), &found) ? h5::elem_name(found) : "not a number") +
                 " (expected " + h5::elem_name(spec.elem) + ")");
      return;
    }
    h5::Handle space = h5::dataspace(H5Dget_space(d));
    int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank != static_cast<int>(spec.dims.size())) {
      add(p, "has rank " + std::to_string(rank) + " (expected " + std::to_string(spec.dims.size()) +
                 ", axes " + axes_text(spec) + ")");
      return;
    }
    std::vector<hsize_t> dims(static_cast<size_t>(rank)), maxdims(static_cast<size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), maxdims.data());
    const AxisSizes& sizes = sizes_for(p);
    for (int i = 0; i < rank; ++i) {
      Axis a = spec.dims[static_cast<size_t>(i)];
      int64_t want = sizes.of(spec, size_t(i));
      int64_t have = static_cast<int64_t>(dims[static_cast<size_t>(i)]);
      bool grows = axis_grows(a);
      bool ok = (grows && !complete_) ? have >= want : have == want;
      if (!ok) {
        add(p, "axis " + std::to_string(i) + " (" + axis_label(spec, size_t(i)) + ") has length " +
                   std::to_string(have) + " (expected " + (grows && !complete_ ? "at least " : "") +
                   std::to_string(want) + ")");
      }
      if (grows && maxdims[static_cast<size_t>(i)] != H5S_UNLIMITED)
        add(p, "axis " + std::to_string(i) + " (" + axis_label(spec, size_t(i)) +
                   ") is not extendible (expected unlimited max dimension)");
    }
    if (rank > 0) {
      h5::Handle dcpl = h5::plist(H5Dget_create_plist(d));
      if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED)
        add(p, "is not chunked (expected chunked layout)");
    }
    std::string s, why;
    if (!h5::read_attr_string(d, "units", &s, &why)) add(p + " attribute units", why);
    if (!h5::read_attr_string(d, "meaning", &s, &why)) add(p + " attribute meaning", why);
  }

  // Each series says what it holds, like every dataset (the shapes of
  // /series/<name>/value are checked with the other datasets).
  void check_series_attributes() {
    for (const SeriesSpec& series : layout_.series) {
      const std::string g = "/series/" + series.name;
      h5::Handle group = h5::group(H5Gopen2(file_, g.c_str(), H5P_DEFAULT));
      std::string s, why;
      for (const char* name : {"meaning", "units"})
        if (!group || !h5::read_attr_string(group.get(), name, &s, &why))
          add(g + " attribute " + name, group ? why : "cannot be read");
    }
  }

  static std::string axes_text(const DatasetSpec& spec) {
    std::string out = "[";
    for (size_t i = 0; i < spec.dims.size(); ++i)
      out += std::string(i ? ", " : "") + axis_label(spec, i);
    return out + "]";
  }

  // ---- values ---------------------------------------------------------------

  // Checks lo <= v < hi (or v == allowed) for every row of a 1-D integer column.
  void check_int_column(const std::string& p, int64_t rows, int64_t lo, int64_t hi,
                        int64_t also_allowed = INT64_MIN) {
    int64_t bad = 0, first_row = -1, first_value = 0;
    scan<int64_t>(p, rows, [&](int64_t off, const std::vector<int64_t>& v) {
      for (size_t i = 0; i < v.size(); ++i) {
        if ((v[i] >= lo && v[i] < hi) || v[i] == also_allowed) continue;
        if (bad++ == 0) {
          first_row = off + static_cast<int64_t>(i);
          first_value = v[i];
        }
      }
    });
    if (bad > 0) {
      std::string allowed = range_text(lo, hi);
      if (also_allowed != INT64_MIN) allowed += " or " + std::to_string(also_allowed);
      add(p, std::to_string(bad) + " value(s) outside " + allowed + "; first at row " +
                 std::to_string(first_row) + " = " + std::to_string(first_value));
    }
  }

  void check_float_column(const std::string& p, int64_t rows, double lo, double hi, bool allow_nan,
                          hid_t mem = -1) {
    int64_t bad = 0, first_row = -1;
    double first_value = 0;
    size_t per_row = 1;  // elements per row of axis 0
    if (hid_t d = open(p); d >= 0)
      for (size_t i = 1; i < h5::extent(d).size(); ++i)
        per_row *= static_cast<size_t>(h5::extent(d)[i]);
    auto check = [&](int64_t off, const std::vector<float>& v) {
      for (size_t i = 0; i < v.size(); ++i) {
        float x = v[i];
        if (std::isnan(x) ? allow_nan : (x >= lo && x <= hi)) continue;
        if (bad++ == 0) {
          first_row = off + static_cast<int64_t>(i / per_row);
          first_value = x;
        }
      }
    };
    scan<float>(p, rows, check, mem);
    if (bad > 0)
      add(p, std::to_string(bad) + " value(s) outside [" + fmt(lo) + ", " + fmt(hi) + "]" +
                 (allow_nan ? " (NaN allowed)" : "") + "; first at row " +
                 std::to_string(first_row) + " = " + fmt(first_value));
  }

  // A series value is a number the policy recorded, or NaN where it
  // recorded none (trace-format.md); an infinity is neither.
  void check_series_values(int64_t S, int64_t L, int64_t K) {
    L = std::max<int64_t>(1, L), K = std::max<int64_t>(1, K);
    for (const SeriesSpec& series : layout_.series) {
      const std::string p = "/series/" + series.name + "/value";
      int64_t bad = 0, first = -1;
      float first_value = 0;
      scan<float>(p, S, [&](int64_t off, const std::vector<float>& v) {
        for (size_t i = 0; i < v.size(); ++i)
          if (std::isinf(v[i]) && bad++ == 0) first = off * L * K + int64_t(i), first_value = v[i];
      });
      if (bad > 0)
        add(p, std::to_string(bad) +
                   " infinite value(s) (expected a finite value, or NaN where "
                   "the policy recorded none); first at step " +
                   std::to_string(first / (L * K)) + ", layer " + std::to_string(first / K % L) +
                   ", kv head " + std::to_string(first % K) + " = " + fmt(first_value));
    }
  }

  static std::string fmt(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }

  void check_values() {
    const int64_t S = sizes_[Axis::Steps], T = sizes_[Axis::Tokens];
    const int64_t E = sizes_.table_rows[table_of<Event>().group];
    const int64_t L = run_.model.n_layers, K = run_.model.n_kv_heads;
    check_steps(S, T, E);
    check_int_column("/tokens/id", T, 0, run_.model.vocab_size);
    check_int_column("/tokens/role", T, 0, kTokenRoleCount);
    check_int_column("/tokens/prompt_offset", T, -1, INT64_MAX);
    check_float_column("/steps/t_start_s", S, 0.0, 1e12, false, H5T_NATIVE_FLOAT);
    check_float_column("/steps/wall_s", S, 0.0, 1e12, false, H5T_NATIVE_FLOAT);
    check_int_column("/steps/entries", S, 0, INT64_MAX);
    check_int_column("/steps/kv_bytes", S, 0, INT64_MAX);
    check_int_column("/occupancy/tier_bytes", S, 0, INT64_MAX);
    check_int_column("/tokens/step", T, 0, std::max<int64_t>(S, 1));
    check_int_column("/tokens/position", T, 0, kMaxTokens);
    check_int_column("/tokens/text_len", T, 0, INT32_MAX);
    check_text_ranges(T);
    check_table(table_of<Event>(), E);
    check_lifetimes(S);
    check_occupancy(S);
    if (R_ > 1) check_intervals(L, K);
    if (layout_.received) check_received(S, T);
    if (layout_.pooled_block > 0) check_pooled();
    if (layout_.topk > 0) {
      check_int_column("/attention/topk/index", T, -1, T);
      check_float_column("/attention/topk/weight", T, 0.0, 1.0001, true);
    }
    if (!layout_.dense_heads.empty()) check_dense(T);
    if (layout_.oracle) {
      check_float_column("/oracle/lost_mass", S, 0.0, 1.0001, true);
      check_float_column("/oracle/recall", S, 0.0, 1.0, true);
      check_float_column("/oracle/kl", S, -1e-4, 1e9, true);
    }
    for (const RowTableSpec* t : step_tables())
      if (holds(*t)) check_table(*t, sizes_.table_rows[t->group]);
    if (has_reconstruction_) check_reconstruction(S);
    check_series_values(S, L, K);
    int64_t reason = read_scalar<int64_t>("/generation/finish_reason");
    if (reason < 0 || reason > 5)
      add("/generation/finish_reason", "is " + std::to_string(reason) + " (expected 0..5)");
    int64_t success = read_scalar<int64_t>("/generation/success");
    if (success < -1 || success > 1)
      add("/generation/success", "is " + std::to_string(success) + " (expected -1, 0 or 1)");
    if (opened_.minor_version >= 6) check_score(success);
  }

  // The score is a share in [0, 1], 1 exactly when the task succeeded, and
  // NaN exactly when there is no task outcome.
  void check_score(int64_t success) {
    const double score = read_scalar<double>("/generation/score");
    const bool defined = !std::isnan(score);
    if (defined && (score < 0 || score > 1))
      add("/generation/score", "is " + fmt(score) + " (expected 0..1 or NaN)");
    else if (defined != (success >= 0))
      add("/generation/score", "is " + fmt(score) + " with success " + std::to_string(success) +
                                   " (expected NaN exactly when success is -1)");
    else if (defined && (score == 1) != (success == 1))
      add("/generation/score", "is " + fmt(score) + " with success " + std::to_string(success) +
                                   " (expected 1 exactly when success is 1)");
  }

  void check_steps(int64_t S, int64_t T, int64_t E) {
    check_int_column("/steps/kind", S, 0, has_reconstruction_ ? 3 : 2);
    int64_t expect_token = 0, expect_event = 0;
    bool reported_tokens = false, reported_events = false;
    for (int64_t b = 0; b < S; b += 65536) {
      int64_t e = std::min(S, b + 65536);
      auto first = read_rows<int64_t>("/steps/first_token", b, e);
      auto n = read_rows<int64_t>("/steps/n_tokens", b, e);
      auto eb = read_rows<int64_t>("/steps/event_begin", b, e);
      auto ec = read_rows<int64_t>("/steps/event_count", b, e);
      const size_t rows = static_cast<size_t>(e - b);
      if (first.size() != rows || n.size() != rows || eb.size() != rows || ec.size() != rows)
        return;
      for (int64_t i = 0; i < e - b; ++i) {
        if (!reported_tokens && (n[i] < 0 || (n[i] > 0 && first[i] != expect_token))) {
          add("/steps/first_token",
              "step " + std::to_string(b + i) + " starts at token " + std::to_string(first[i]) +
                  " (expected " + std::to_string(expect_token) + ", steps feed tokens in order)");
          reported_tokens = true;
        }
        if (!reported_events && (ec[i] < 0 || eb[i] != expect_event)) {
          add("/steps/event_begin", "step " + std::to_string(b + i) + " begins at event " +
                                        std::to_string(eb[i]) + " (expected " +
                                        std::to_string(expect_event) + ")");
          reported_events = true;
        }
        expect_token = first[i] + n[i];
        // Values from the file: a sum past int64 matches no event count.
        expect_event = eb[i] >= 0 && ec[i] >= 0 && ec[i] <= INT64_MAX - eb[i] ? eb[i] + ec[i] : -1;
      }
    }
    if (!reported_tokens && expect_token != T)
      add("/steps/n_tokens", "steps feed " + std::to_string(expect_token) +
                                 " tokens but /tokens holds " + std::to_string(T) +
                                 " (expected equal)");
    if (!reported_events && expect_event != E)
      add("/steps/event_count", "steps account for " + std::to_string(expect_event) +
                                    " events but /events holds " + std::to_string(E) +
                                    " (expected equal)");
  }

  // Every column of a row table within its declared range (row_tables.cpp),
  // and step rows in step order.
  void check_table(const RowTableSpec& table, int64_t rows) {
    const LimitSizes limits = limit_sizes(run_, layout_, sizes_[Axis::Steps], sizes_[Axis::Tokens]);
    for (const ColumnSpec& c : table.columns) {
      const Range& r = c.range;
      if (r.kind == Range::Kind::Int)
        check_int_column(table.path(c), rows, r.lo, limits[r.limit] + r.offset, r.also);
      else if (r.kind == Range::Kind::Float)
        check_float_column(table.path(c), rows, r.flo, r.fhi, r.nan_ok);
    }
    if (table.step_rows) check_step_order(table.group + "/step", rows);
  }

  // Reconstruction rows (their ranges checked with the other tables) name
  // steps of kind 2, each such step feeds no sequence token and has rows, at
  // positions counting up from its first_token.
  void check_reconstruction(int64_t S) {
    const int64_t C = sizes_.table_rows[table_of<ReconstructionRow>().group];
    auto kind = read_rows<int64_t>("/steps/kind", 0, S);
    auto first = read_rows<int64_t>("/steps/first_token", 0, S);
    auto n = read_rows<int64_t>("/steps/n_tokens", 0, S);
    auto step = read_rows<int64_t>("/reconstruction/step", 0, C);
    auto position = read_rows<int64_t>("/reconstruction/position", 0, C);
    if (kind.size() != size_t(S) || first.size() != size_t(S) || n.size() != size_t(S) ||
        step.size() != size_t(C) || position.size() != size_t(C))
      return;  // their own reports
    std::vector<int64_t> rows(size_t(S), 0);
    for (int64_t i = 0; i < C; ++i) {
      const int64_t s = step[size_t(i)];
      if (s < 0 || s >= S) return;  // reported above
      if (kind[size_t(s)] != 2) {
        add("/reconstruction/step", "row " + std::to_string(i) + " names step " +
                                        std::to_string(s) + ", which is no reconstruction step");
        return;
      }
      if (position[size_t(i)] != first[size_t(s)] + rows[size_t(s)]) {
        add("/reconstruction/position",
            "row " + std::to_string(i) + " is at position " + std::to_string(position[size_t(i)]) +
                " (expected " + std::to_string(first[size_t(s)] + rows[size_t(s)]) + ")");
        return;
      }
      ++rows[size_t(s)];
    }
    for (int64_t s = 0; s < S; ++s) {
      if (kind[size_t(s)] != 2) continue;
      if (n[size_t(s)] != 0 || rows[size_t(s)] == 0) {
        add("/steps/n_tokens", "reconstruction step " + std::to_string(s) + " feeds " +
                                   std::to_string(n[size_t(s)]) + " sequence tokens and " +
                                   std::to_string(rows[size_t(s)]) +
                                   " reconstruction tokens (expected 0 and at least 1)");
        return;
      }
    }
  }

  // A step column whose rows must come in nondecreasing step order.
  void check_step_order(const std::string& path, int64_t rows) {
    int64_t previous = INT64_MIN, bad = 0, first_row = -1, first_step = 0, first_after = 0;
    scan<int64_t>(path, rows, [&](int64_t off, const std::vector<int64_t>& v) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] < previous && bad++ == 0) {
          first_row = off + static_cast<int64_t>(i);
          first_step = v[i];
          first_after = previous;
        }
        previous = v[i];
      }
    });
    if (bad > 0)
      add(path, std::to_string(bad) + " row(s) out of step order; first at row " +
                    std::to_string(first_row) + " = step " + std::to_string(first_step) +
                    " after step " + std::to_string(first_after) +
                    " (expected nondecreasing steps)");
  }

  void check_text_ranges(int64_t T) {
    int64_t bytes = sizes_[Axis::TextBytes];
    int64_t bad = 0, first = -1;
    for (int64_t b = 0; b < T; b += 65536) {
      int64_t e = std::min(T, b + 65536);
      auto begin = read_rows<int64_t>("/tokens/text_begin", b, e);
      auto len = read_rows<int64_t>("/tokens/text_len", b, e);
      if (begin.size() != size_t(e - b) || len.size() != size_t(e - b)) return;
      for (int64_t i = 0; i < e - b; ++i)
        if (begin[i] < 0 || len[i] < 0 || begin[i] > bytes || len[i] > bytes - begin[i])
          if (bad++ == 0) first = b + i;
    }
    if (bad > 0)
      add("/tokens/text_begin",
          std::to_string(bad) + " token piece(s) outside /tokens/text_bytes (" +
              std::to_string(bytes) + " bytes); first at token " + std::to_string(first));
  }

  // Lifetimes of the committed tokens. An incomplete trace may hold values
  // of steps a flush wrote but did not commit (>= S): they are not part of
  // the committed view (the reader shows them as -1), so they are allowed.
  void check_lifetimes(int64_t S) {
    const int64_t L = run_.model.n_layers, K = run_.model.n_kv_heads;
    const int64_t T = sizes_[Axis::Tokens];
    const int64_t hi = complete_ ? S : INT32_MAX;
    if (T <= 0) return;
    struct Column {
      const char* path;
      std::vector<int32_t> values;
      int64_t bad = 0;
      std::string first_bad;
    };
    Column admit{"/lifetimes/admit_step", {}, 0, {}}, evict{"/lifetimes/evict_step", {}, 0, {}};
    int64_t bad_order = 0;
    hsize_t start[3] = {0, 0, 0}, count[3] = {1, hsize_t(K), hsize_t(T)};
    h5::Handle ms = h5::dataspace(H5Screate_simple(3, count, nullptr));
    for (int64_t l = 0; l < L; ++l) {
      start[0] = hsize_t(l);
      for (Column* c : {&admit, &evict}) {
        c->values.assign(static_cast<size_t>(K * T), 0);
        hid_t d = open(c->path);
        h5::Handle fs = h5::dataspace(H5Dget_space(d));
        H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
        if (H5Dread(d, H5T_NATIVE_INT32, ms.get(), fs.get(), H5P_DEFAULT, c->values.data()) < 0) {
          add(c->path, "read failed: " + h5::take_error_message());
          return;
        }
        for (size_t i = 0; i < c->values.size(); ++i) {
          int32_t v = c->values[i];
          if (v >= -1 && v < hi) continue;
          if (c->bad++ == 0)
            c->first_bad = "layer " + std::to_string(l) + ", kv head " +
                           std::to_string(int64_t(i) / T) + ", token " +
                           std::to_string(int64_t(i) % T) + " = " + std::to_string(v);
        }
      }
      for (size_t i = 0; i < admit.values.size(); ++i) {
        int32_t a = admit.values[i] < S ? admit.values[i] : -1;
        int32_t e = evict.values[i] < S ? evict.values[i] : -1;
        if (e >= 0 && (a < 0 || e < a)) ++bad_order;
      }
    }
    for (const Column* c : {&admit, &evict})
      if (c->bad > 0)
        add(c->path, std::to_string(c->bad) + " step value(s) outside [-1, " + std::to_string(hi) +
                         "); first at " + c->first_bad);
    if (bad_order > 0)
      add("/lifetimes/evict_step", std::to_string(bad_order) +
                                       " token(s) evicted before they were admitted (expected "
                                       "evict_step >= admit_step >= 0)");
  }

  void check_occupancy(int64_t S) {
    const int64_t per_step = run_.model.n_layers * run_.model.n_kv_heads * R_;
    int64_t negative = 0, mismatch = 0, first_mismatch = -1;
    for (int64_t b = 0; b < S; b += 4096) {
      int64_t e = std::min(S, b + 4096);
      auto occ = read_rows<int64_t>("/occupancy/entries", b, e);
      auto entries = read_rows<int64_t>("/steps/entries", b, e);
      if (occ.size() != size_t((e - b) * per_step) || entries.size() != size_t(e - b)) return;
      for (int64_t s = 0; s < e - b; ++s) {
        int64_t sum = 0;
        for (int64_t i = 0; i < per_step; ++i) {
          int64_t v = occ[size_t(s * per_step + i)];
          if (v < 0) ++negative;
          sum += v;
        }
        if (sum != entries[size_t(s)] && mismatch++ == 0) first_mismatch = b + s;
      }
    }
    if (negative > 0)
      add("/occupancy/entries", std::to_string(negative) + " negative count(s) (expected >= 0)");
    if (mismatch > 0)
      add("/steps/entries",
          std::to_string(mismatch) +
              " step(s) whose entries differ from the sum of /occupancy/entries; first "
              "at step " +
              std::to_string(first_mismatch));
  }

  void check_intervals(int64_t L, int64_t K) {
    const int64_t I = sizes_.table_rows[table_of<TierInterval>().group];
    check_table(table_of<TierInterval>(), I);
    if (complete_) {
      auto index = read_rows<int64_t>("/lifetimes/interval_index", 0, L * K + 1);
      bool ok = !index.empty() && index.front() == 0 && index.back() == I;
      for (size_t i = 1; ok && i < index.size(); ++i) ok = index[i] >= index[i - 1];
      if (!ok)
        add("/lifetimes/interval_index",
            "is not a non-decreasing index from 0 to the interval count " + std::to_string(I));
    }
  }

  void check_received(int64_t S, int64_t T) {
    int64_t N = sizes_[Axis::ReceivedRows];
    int64_t bad = 0, first = -1;
    for (int64_t b = 0; b < S; b += 4096) {
      int64_t e = std::min(S, b + 4096);
      auto off = read_rows<int64_t>("/attention/received/offset", b, e);
      auto cnt = read_rows<int64_t>("/attention/received/count", b, e);
      if (off.size() != cnt.size()) return;
      for (size_t i = 0; i < off.size(); ++i)
        if (cnt[i] < 0 || (cnt[i] > 0 && (off[i] < 0 || off[i] > N || cnt[i] > N - off[i])))
          if (bad++ == 0) first = b + int64_t(i) / (run_.model.n_layers * run_.model.n_kv_heads);
    }
    if (bad > 0)
      add("/attention/received/offset",
          std::to_string(bad) + " (offset, count) pair(s) outside the " + std::to_string(N) +
              " rows of token/mass; first at step " + std::to_string(first));
    check_int_column("/attention/received/token", N, 0, T);
    check_float_column("/attention/received/mass", N, 0.0, 1.0001, false);
  }

  // Dense rows [D, T, T]: attention weights, 0 where not attended, never NaN.
  // Read a block of query rows of one head at a time (a whole plane of a long
  // capture does not fit in a bounded read).
  void check_dense(int64_t T) {
    const char* p = "/attention/dense/weight";
    hid_t d = open(p);
    std::vector<hsize_t> e = h5::extent(d);
    if (e.size() != 3 || T <= 0) return;
    const hsize_t rows = std::max<hsize_t>(1, kScanBlockBytes / (4 * std::max<hsize_t>(1, e[2])));
    int64_t bad = 0;
    std::string first;
    for (hsize_t h = 0; h < e[0]; ++h)
      for (hsize_t q = 0; q < static_cast<hsize_t>(T); q += rows) {
        hsize_t start[3] = {h, q, 0}, count[3] = {1, std::min<hsize_t>(rows, hsize_t(T) - q), e[2]};
        std::vector<float> v(static_cast<size_t>(count[1] * count[2]));
        h5::Handle fs = h5::dataspace(H5Dget_space(d));
        H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
        h5::Handle ms = h5::dataspace(H5Screate_simple(3, count, nullptr));
        if (H5Dread(d, H5T_NATIVE_FLOAT, ms.get(), fs.get(), H5P_DEFAULT, v.data()) < 0) {
          add(p, "read failed: " + h5::take_error_message());
          return;
        }
        for (size_t i = 0; i < v.size(); ++i)
          if (!(v[i] >= 0.0f && v[i] <= 1.0001f) && bad++ == 0)
            first = "dense head " + std::to_string(h) + ", query token " +
                    std::to_string(q + i / e[2]) + ", key token " + std::to_string(i % e[2]) +
                    " = " + fmt(v[i]);
      }
    if (bad > 0)
      add(p,
          std::to_string(bad) + " weight(s) outside [0, 1] (attention weights); first at " + first);
  }

  void check_pooled() {
    for (const char* p : {"/attention/pooled/max", "/attention/pooled/mean"}) {
      hid_t d = open(p);
      std::vector<hsize_t> e = h5::extent(d);
      // Scan per (layer, head) plane to keep reads chunk-aligned and bounded.
      int64_t bad = 0;
      for (hsize_t l = 0; l < e[0]; ++l) {
        hsize_t start[4] = {l, 0, 0, 0}, count[4] = {1, e[1], e[2], e[3]};
        std::vector<uint16_t> raw(static_cast<size_t>(e[1] * e[2] * e[3]));
        if (raw.empty()) continue;
        h5::Handle fs = h5::dataspace(H5Dget_space(d));
        H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
        h5::Handle ms = h5::dataspace(H5Screate_simple(4, count, nullptr));
        if (H5Dread(d, h5::memory_type(Elem::F16), ms.get(), fs.get(), H5P_DEFAULT, raw.data()) <
            0) {
          add(p, "read failed: " + h5::take_error_message());
          return;
        }
        for (uint16_t h : raw) {
          float v = half_to_float(h);
          if (!(v >= 0.0f && v <= 1.001f)) ++bad;
        }
      }
      if (bad > 0) add(p, std::to_string(bad) + " value(s) outside [0, 1] (attention weights)");
    }
  }
};

}  // namespace

ValidationReport validate_trace(const std::string& path) {
  return Validator(path).run();
}

ValidationReport validate_trace_image(const std::string& name, const void* data, size_t size) {
  return Validator(name, data, size).run();
}

}  // namespace kvscope::trace
