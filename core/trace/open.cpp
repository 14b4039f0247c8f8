#include "core/trace/open.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/trace/heap_checked_driver.h"

namespace kvscope::trace {

namespace {

void check_readable(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw TraceError(ErrorCode::Io, path, "", std::string("cannot open: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw TraceError(ErrorCode::Io, path, "", "is a directory, not a trace");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw TraceError(ErrorCode::Io, path, "", "cannot open for reading");
  if (st.st_size == 0)
    throw TraceError(ErrorCode::NotATrace, path, "", "empty file, not a KVScope trace");
}

// A writer in SWMR mode marks the superblock ("file consistency flags"), and
// a writer that has not started SWMR yet holds the file lock; a plain open
// refuses both, and only then is SWMR read needed.
bool refused_for_writer(const std::string& hdf5_message) {
  for (const char* sign : {"consistency flags", "already open for write", "lock"})
    if (hdf5_message.find(sign) != std::string::npos) return true;
  return false;
}

struct Image {
  const void* data;
  size_t size;
};

// Opens read-only through the heap-checked driver (heap_checked_driver.h);
// on failure *error holds HDF5's reason (taken before the property list
// closes: every HDF5 call clears the error stack).
h5::Handle open_read_only(const std::string& path, const Image* image, bool swmr,
                          std::string* error) {
  h5::Handle fapl =
      h5::plist(image ? h5::checked_image_fapl(image->data, image->size) : h5::checked_read_fapl());
  unsigned flags = H5F_ACC_RDONLY;
  if (swmr) {
    // HDF5 retries a metadata read whose checksum fails, sleeping 1, 2, 4, ...
    // ns between attempts; its SWMR default of 100 attempts sleeps for 2^100
    // ns on a damaged file. kSwmrReadAttempts bounds the wait (see open.h).
    H5Pset_metadata_read_attempts(fapl.get(), kSwmrReadAttempts);
    flags |= H5F_ACC_SWMR_READ;
  }
  h5::Handle file = h5::file(H5Fopen(path.c_str(), flags, fapl.get()));
  if (!file) *error = h5::take_error_message();
  return file;
}

// Whether an image starts with HDF5's signature at 0, 512, 1024, ... (as
// H5Fis_hdf5 looks for it in a file).
bool has_hdf5_signature(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  for (size_t at = 0; at + 8 <= size; at = at == 0 ? 512 : at * 2)
    if (std::memcmp(data + at, kSignature, 8) == 0) return true;
  return false;
}

// The root attributes: format, version, minor version and writer.
void check_format(const std::string& path, OpenedTrace* opened) {
  OpenedTrace& out = *opened;
  hid_t f = out.file.get();
  std::string format, why;
  if (!h5::read_attr_string(f, "format", &format, &why)) {
    if (H5Aexists(f, "format") > 0)
      throw TraceError(ErrorCode::Io, path, "/ attribute format", why);
    H5Eclear2(H5E_DEFAULT);
    throw TraceError(ErrorCode::NotATrace, path, "/ attribute format",
                     "missing; this HDF5 file is not a KVScope trace (expected format = \"" +
                         std::string(kFormatName) + "\")");
  }
  if (format != kFormatName)
    throw TraceError(
        ErrorCode::NotATrace, path, "/ attribute format",
        "is \"" + format + "\"; not a KVScope trace (expected \"" + kFormatName + "\")");
  if (!h5::read_attr_i64(f, "version", &out.version))
    throw TraceError(ErrorCode::Schema, path, "/ attribute version",
                     "missing or not an integer (expected " + std::to_string(kFormatVersion) + ")");
  if (out.version > kFormatVersion)
    throw TraceError(ErrorCode::TooNew, path, "/ attribute version",
                     "trace format version " + std::to_string(out.version) +
                         " is too new: this KVScope reads versions " +
                         std::to_string(kOldestReadableVersion) + " to " +
                         std::to_string(kFormatVersion) + "; upgrade KVScope");
  if (out.version < kOldestReadableVersion)
    throw TraceError(ErrorCode::TooOld, path, "/ attribute version",
                     "trace format version " + std::to_string(out.version) +
                         " is too old: this KVScope reads versions " +
                         std::to_string(kOldestReadableVersion) + " to " +
                         std::to_string(kFormatVersion) + "; re-capture or convert it");
  h5::read_attr_i64(f, "minor_version", &out.minor_version);
  h5::read_attr_string(f, "writer", &out.writer);
}

// Opens the file (or its image) plainly, or in SWMR-read mode when a writer
// holds or left it, then checks format and version.
OpenedTrace open_checked(const std::string& path, const Image* image) {
  OpenedTrace out;
  // A complete trace opens plainly: one read attempt per metadata object, so
  // a damaged file fails at once. Both opens read through the heap-checked
  // driver (heap_checked_driver.h). SWMR read is only for a trace a writer
  // holds open (being captured, or left so by a killed capture).
  std::string plain_error;
  out.file = open_read_only(path, image, /*swmr=*/false, &plain_error);
  if (!out.file && refused_for_writer(plain_error)) {
    out.file = open_read_only(path, image, /*swmr=*/true, &plain_error);
    out.swmr = static_cast<bool>(out.file);
  }
  if (!out.file)
    throw TraceError(ErrorCode::Io, path, "", "HDF5 file is damaged or truncated: " + plain_error);
  check_format(path, &out);
  return out;
}

}  // namespace

OpenedTrace open_trace_file(const std::string& path) {
  h5::silence_library_errors();
  check_readable(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw TraceError(ErrorCode::NotATrace, path, "",
                     "not an HDF5 file (no HDF5 signature), so not a KVScope trace");
  }
  return open_checked(path, nullptr);
}

OpenedTrace open_trace_image(const std::string& name, const void* data, size_t size) {
  h5::silence_library_errors();
  if (size == 0)
    throw TraceError(ErrorCode::NotATrace, name, "", "empty file, not a KVScope trace");
  if (!has_hdf5_signature(static_cast<const uint8_t*>(data), size))
    throw TraceError(ErrorCode::NotATrace, name, "",
                     "not an HDF5 file (no HDF5 signature), so not a KVScope trace");
  const Image image{data, size};
  return open_checked(name, &image);
}

namespace {

struct RunAttrReader {
  hid_t run;
  std::vector<Problem>* problems;

  void problem(ErrorCode code, const std::string& name, const std::string& message) {
    problems->push_back({code, "/run attribute " + name, message});
  }
  void str(const char* name, std::string* out) {
    std::string why;
    if (!h5::read_attr_string(run, name, out, &why)) problem(ErrorCode::Schema, name, why);
  }
  void strs(const char* name, std::vector<std::string>* out, int64_t max_count) {
    std::string why;
    if (!h5::read_attr_strings(run, name, out, static_cast<size_t>(max_count), &why))
      problem(ErrorCode::Schema, name, why);
    else if (out->empty())
      problem(ErrorCode::Schema, name, "is empty (expected at least one name)");
  }
  void i64(const char* name, int64_t* out) {
    if (!h5::read_attr_i64(run, name, out))
      problem(ErrorCode::Schema, name, "missing or not an integer");
  }
  void range(const char* name, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi)
      problem(value > hi ? ErrorCode::TooLarge : ErrorCode::Schema, name,
              "is " + std::to_string(value) + " (expected " + std::to_string(lo) + ".." +
                  std::to_string(hi) + ")");
  }
};

// The links of a group in name order; at most max + 1 names (one more than
// allowed tells the caller there are too many without listing them all).
std::vector<std::string> link_names(hid_t group, size_t max) {
  struct Names {
    std::vector<std::string> list;
    size_t max;
  } names{{}, max};
  H5Literate(
      group, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        auto* out = static_cast<Names*>(data);
        if (out->list.size() > out->max) return 1;
        out->list.push_back(name);
        return 0;
      },
      &names);
  return names.list;
}

// /series "order" must name exactly the subgroups of /series: indices follow
// it, and a series missing from it could not be read by index.
bool check_series_order(const std::vector<std::string>& order,
                        const std::vector<std::string>& groups, std::vector<Problem>* problems) {
  const size_t before = problems->size();
  const std::string field = "/series attribute order";
  for (size_t i = 0; i < order.size(); ++i) {
    if (std::find(order.begin(), order.begin() + long(i), order[i]) != order.begin() + long(i))
      problems->push_back({ErrorCode::Schema, field, "names " + order[i] + " twice"});
    else if (std::find(groups.begin(), groups.end(), order[i]) == groups.end())
      problems->push_back(
          {ErrorCode::Schema, field, "names " + order[i] + ", which is not a group under /series"});
  }
  for (const std::string& g : groups)
    if (std::find(order.begin(), order.end(), g) == order.end())
      problems->push_back(
          {ErrorCode::Schema, field, "does not name /series/" + g + " (expected every series)"});
  return problems->size() == before;
}

// Minor version 2: /series, present only when the policy declared a series
// (older traces have none, and read as an empty list).
void read_series(hid_t file, CaptureLayout* layout, std::vector<Problem>* problems) {
  if (!h5::link_exists(file, "/series")) return;
  h5::Handle g = h5::group(H5Gopen2(file, "/series", H5P_DEFAULT));
  if (!g) {
    H5Eclear2(H5E_DEFAULT);
    problems->push_back({ErrorCode::Schema, "/series", "is not a group"});
    return;
  }
  const std::vector<std::string> groups = link_names(g.get(), static_cast<size_t>(kMaxSeries));
  if (groups.size() > static_cast<size_t>(kMaxSeries)) {
    problems->push_back(
        {ErrorCode::TooLarge, "/series", "more than " + std::to_string(kMaxSeries) + " series"});
    return;
  }
  std::vector<std::string> order;
  if (!h5::read_attr_strings(g.get(), "order", &order, static_cast<size_t>(kMaxSeries))) {
    problems->push_back(
        {ErrorCode::Schema, "/series attribute order", "missing or not a list of series names"});
    return;
  }
  if (!check_series_order(order, groups, problems)) return;
  for (const std::string& name : order) {
    h5::Handle sg = h5::group(H5Gopen2(g.get(), name.c_str(), H5P_DEFAULT));
    if (!sg) {
      H5Eclear2(H5E_DEFAULT);
      problems->push_back({ErrorCode::Schema, "/series/" + name, "is not a group"});
      continue;
    }
    SeriesSpec spec;
    spec.name = name;
    h5::read_attr_string(sg.get(), "meaning", &spec.meaning);
    h5::read_attr_string(sg.get(), "units", &spec.units);
    layout->series.push_back(spec);
  }
}

// Minor version 3: /run tier_attended, one 0/1 flag per tier. Older traces
// have none: their policies attended every tier they held.
void read_tier_attended(hid_t file, hid_t run_group, RunInfo* run, std::vector<Problem>* problems) {
  const std::string field = "/run attribute tier_attended";
  const size_t tiers = run->tier_names.size();
  int64_t minor = 0;
  h5::read_attr_i64(file, "minor_version", &minor);
  if (minor < 3 && H5Aexists(run_group, "tier_attended") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    run->tier_attended.assign(tiers, 1);
    return;
  }
  std::vector<int64_t> flags;
  std::string why;
  if (!h5::read_attr_ints(run_group, "tier_attended", &flags, static_cast<size_t>(kMaxTiers),
                          &why)) {
    problems->push_back({ErrorCode::Schema, field, why});
    return;
  }
  if (flags.size() != tiers) {
    problems->push_back({ErrorCode::Schema, field,
                         "has " + std::to_string(flags.size()) +
                             " flags (expected one per tier_names entry: " + std::to_string(tiers) +
                             ")"});
    return;
  }
  run->tier_attended.clear();
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] != 0 && flags[i] != 1) {
      problems->push_back(
          {ErrorCode::Schema, field,
           "flag " + std::to_string(i) + " is " + std::to_string(flags[i]) + " (expected 0 or 1)"});
      return;
    }
    run->tier_attended.push_back(static_cast<uint8_t>(flags[i]));
  }
}

// Minor version 8: /run kv_dtype and tier_formats. Older traces stored
// every full-precision row as float32 and did not record the formats.
void read_storage_formats(hid_t file, hid_t run_group, RunInfo* run,
                          std::vector<Problem>* problems) {
  int64_t minor = 0;
  h5::read_attr_i64(file, "minor_version", &minor);
  if (minor < 8 && H5Aexists(run_group, "kv_dtype") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    run->model.kv_dtype = "fp32";
    run->tier_formats.clear();
    return;
  }
  std::string why;
  if (!h5::read_attr_string(run_group, "kv_dtype", &run->model.kv_dtype, &why))
    problems->push_back({ErrorCode::Schema, "/run attribute kv_dtype", why});
  else if (run->model.kv_dtype != "fp32" && run->model.kv_dtype != "bf16" &&
           run->model.kv_dtype != "fp16")
    problems->push_back({ErrorCode::Schema, "/run attribute kv_dtype",
                         "is \"" + run->model.kv_dtype + "\" (expected fp32, bf16 or fp16)"});
  if (!h5::read_attr_strings(run_group, "tier_formats", &run->tier_formats,
                             static_cast<size_t>(kMaxTiers), &why)) {
    problems->push_back({ErrorCode::Schema, "/run attribute tier_formats", why});
    return;
  }
  if (run->tier_formats.size() != run->tier_names.size()) {
    problems->push_back({ErrorCode::Schema, "/run attribute tier_formats",
                         "has " + std::to_string(run->tier_formats.size()) +
                             " formats (expected one per tier_names entry: " +
                             std::to_string(run->tier_names.size()) + ")"});
    return;
  }
  for (const std::string& f : run->tier_formats)
    if (f != "float32" && f != "bfloat16" && f != "float16" && f != "int4") {
      problems->push_back({ErrorCode::Schema, "/run attribute tier_formats",
                           "holds \"" + f + "\" (expected float32, bfloat16, float16 or int4)"});
      return;
    }
}

// Minor version 9: /run layer_window and layer_ffn, one entry per layer.
// Older traces: every layer global and dense (the families they could hold
// with a sliding window, Mistral and Qwen2, are read as global: the window
// was not recorded).
void read_layer_types(hid_t file, hid_t run_group, RunInfo* run, std::vector<Problem>* problems) {
  ModelInfo& m = run->model;
  const size_t L = static_cast<size_t>(std::max<int64_t>(m.n_layers, 0));
  int64_t minor = 0;
  h5::read_attr_i64(file, "minor_version", &minor);
  if (minor < 9 && H5Aexists(run_group, "layer_window") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    m.layer_window.assign(L, 0);
    m.layer_ffn.assign(L, "dense");
    return;
  }
  std::string why;
  const std::string window_field = "/run attribute layer_window";
  if (!h5::read_attr_ints(run_group, "layer_window", &m.layer_window, size_t(kMaxLayers), &why)) {
    problems->push_back({ErrorCode::Schema, window_field, why});
  } else if (m.layer_window.size() != L) {
    problems->push_back({ErrorCode::Schema, window_field,
                         "has " + std::to_string(m.layer_window.size()) +
                             " windows (expected one per layer: " + std::to_string(L) + ")"});
  } else {
    for (int64_t w : m.layer_window)
      if (w < 0) {
        problems->push_back({ErrorCode::Schema, window_field,
                             "holds " + std::to_string(w) + " (expected 0 or a positive window)"});
        break;
      }
  }
  const std::string ffn_field = "/run attribute layer_ffn";
  if (!h5::read_attr_strings(run_group, "layer_ffn", &m.layer_ffn, size_t(kMaxLayers), &why)) {
    problems->push_back({ErrorCode::Schema, ffn_field, why});
  } else if (m.layer_ffn.size() != L) {
    problems->push_back({ErrorCode::Schema, ffn_field,
                         "has " + std::to_string(m.layer_ffn.size()) +
                             " kinds (expected one per layer: " + std::to_string(L) + ")"});
  } else {
    for (const std::string& f : m.layer_ffn)
      if (f != "dense" && f != "moe") {
        problems->push_back(
            {ErrorCode::Schema, ffn_field, "holds \"" + f + "\" (expected dense or moe)"});
        break;
      }
  }
}

void read_layout(hid_t file, const RunInfo& run, CaptureLayout* layout,
                 std::vector<Problem>* problems) {
  auto group_attr = [&](const char* group, const char* name, int64_t* out, int64_t lo, int64_t hi) {
    if (!h5::link_exists(file, group)) return;
    h5::Handle g = h5::group(H5Gopen2(file, group, H5P_DEFAULT));
    if (!g || !h5::read_attr_i64(g.get(), name, out)) {
      problems->push_back({ErrorCode::Schema, std::string(group) + " attribute " + name,
                           "missing or not an integer"});
      *out = 0;
      return;
    }
    if (*out < lo || *out > hi) {
      problems->push_back({*out > hi ? ErrorCode::TooLarge : ErrorCode::Schema,
                           std::string(group) + " attribute " + name,
                           "is " + std::to_string(*out) + " (expected " + std::to_string(lo) +
                               ".." + std::to_string(hi) + ")"});
      *out = 0;
    }
  };
  layout->received = h5::link_exists(file, "/attention/received");
  group_attr("/attention/pooled", "block", &layout->pooled_block, 1, kMaxTokens);
  group_attr("/attention/topk", "k", &layout->topk, 1, kMaxTopK);
  layout->oracle = h5::link_exists(file, "/oracle");
  group_attr("/oracle", "recall_k", &layout->oracle_recall_k, 0, kMaxTokens);

  if (h5::link_exists(file, "/attention/dense/heads")) {
    h5::Handle d = h5::dataset(H5Dopen2(file, "/attention/dense/heads", H5P_DEFAULT));
    std::vector<hsize_t> dims = d ? h5::extent(d.get()) : std::vector<hsize_t>{};
    if (dims.size() != 2 || dims[1] != 2 || dims[0] > static_cast<hsize_t>(kMaxDenseHeads)) {
      problems->push_back({ErrorCode::Schema, "/attention/dense/heads",
                           "expected shape [D, 2] with D <= " + std::to_string(kMaxDenseHeads)});
    } else {
      std::vector<int32_t> pairs(dims[0] * 2);
      if (!pairs.empty() &&
          H5Dread(d.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, pairs.data()) < 0) {
        problems->push_back(
            {ErrorCode::Schema, "/attention/dense/heads", h5::take_error_message()});
      } else {
        for (size_t i = 0; i < dims[0]; ++i) {
          int32_t l = pairs[2 * i], h = pairs[2 * i + 1];
          if (l < 0 || l >= run.model.n_layers || h < 0 || h >= run.model.n_heads)
            problems->push_back({ErrorCode::Schema, "/attention/dense/heads",
                                 "row " + std::to_string(i) + " = (" + std::to_string(l) + ", " +
                                     std::to_string(h) + ") is outside L x H"});
          layout->dense_heads.emplace_back(l, h);
        }
      }
    }
  }

  if (h5::link_exists(file, "/gates")) {
    h5::Handle g = h5::group(H5Gopen2(file, "/gates", H5P_DEFAULT));
    std::vector<std::string> names = link_names(g.get(), static_cast<size_t>(kMaxGates));
    if (names.size() > static_cast<size_t>(kMaxGates))
      problems->push_back(
          {ErrorCode::TooLarge, "/gates", "more than " + std::to_string(kMaxGates) + " gates"});
    // Gate indices follow the writer's order (attribute "order"), not name order.
    std::vector<std::string> order;
    if (names.size() <= static_cast<size_t>(kMaxGates)) {
      if (!h5::read_attr_strings(g.get(), "order", &order, static_cast<size_t>(kMaxGates))) {
        problems->push_back(
            {ErrorCode::Schema, "/gates attribute order", "missing or not a list of gate names"});
      } else {
        std::vector<std::string> a = order, b = names;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a != b)
          problems->push_back({ErrorCode::Schema, "/gates attribute order",
                               "does not list exactly the groups under /gates"});
        else
          names = order;
      }
    }
    for (const std::string& name : names) {
      if (names.size() > static_cast<size_t>(kMaxGates)) break;
      GateSpec spec;
      spec.name = name;
      h5::Handle gg = h5::group(H5Gopen2(g.get(), name.c_str(), H5P_DEFAULT));
      if (!gg) {
        H5Eclear2(H5E_DEFAULT);
        problems->push_back({ErrorCode::Schema, "/gates/" + name, "is not a group"});
        continue;
      }
      h5::read_attr_string(gg.get(), "meaning", &spec.meaning);
      h5::read_attr_string(gg.get(), "units", &spec.units);
      h5::read_attr_f64(gg.get(), "threshold", &spec.threshold);
      int64_t tv = 0;
      h5::read_attr_i64(gg.get(), "time_varying", &tv);
      spec.time_varying = tv != 0;
      layout->gates.push_back(spec);
    }
  }
  read_series(file, layout, problems);
}

}  // namespace

// The groups the run says it recorded exist: every level of capture_levels
// ("events+received+pooled:16+oracle", or comma-separated) and, from minor
// version 1, every gate of /run gate_names. A deleted group must not read as
// "not captured".
void check_declared_groups(hid_t file, const RunInfo& run, const CaptureLayout& layout,
                           std::vector<Problem>* problems) {
  const struct {
    const char* level;
    const char* group;
    bool present;
  } levels[] = {{"received", "/attention/received", layout.received},
                {"pooled", "/attention/pooled", layout.pooled_block > 0},
                {"dense", "/attention/dense", !layout.dense_heads.empty()},
                {"topk", "/attention/topk", layout.topk > 0},
                {"oracle", "/oracle", layout.oracle}};
  std::string levels_text = run.capture_levels;
  std::replace(levels_text.begin(), levels_text.end(), ',', '+');
  std::vector<std::string> names;
  for (size_t at = 0; at <= levels_text.size();) {
    size_t end = std::min(levels_text.find('+', at), levels_text.size());
    const std::string item = levels_text.substr(at, end - at);
    names.push_back(item.substr(0, item.find(':')));
    at = end + 1;
  }
  for (const auto& l : levels)
    if (!l.present && std::find(names.begin(), names.end(), l.level) != names.end())
      problems->push_back({ErrorCode::Schema, l.group,
                           std::string("group missing (/run attribute capture_levels \"") +
                               run.capture_levels + "\" lists " + l.level + ")"});

  h5::Handle g = h5::group(H5Gopen2(file, "/run", H5P_DEFAULT));
  if (H5Aexists(g.get(), "gate_names") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return;  // minor version 0
  }
  std::vector<std::string> gate_names;
  std::string why;
  if (!h5::read_attr_strings(g.get(), "gate_names", &gate_names, static_cast<size_t>(kMaxGates),
                             &why)) {
    problems->push_back({ErrorCode::Schema, "/run attribute gate_names", why});
    return;
  }
  for (const std::string& name : gate_names) {
    const bool found = std::any_of(layout.gates.begin(), layout.gates.end(),
                                   [&](const GateSpec& spec) { return spec.name == name; });
    if (!found)
      problems->push_back({ErrorCode::Schema, "/gates/" + name,
                           "group missing (/run attribute gate_names lists " + name + ")"});
  }
}

void read_run_info(hid_t file, RunInfo* run, CaptureLayout* layout,
                   std::vector<Problem>* problems) {
  if (!h5::link_exists(file, "/run")) {
    problems->push_back({ErrorCode::Schema, "/run", "group missing"});
    return;
  }
  h5::Handle g = h5::group(H5Gopen2(file, "/run", H5P_DEFAULT));
  size_t before = problems->size();
  RunAttrReader r{g.get(), problems};
  ModelInfo& m = run->model;
  r.str("model_name", &m.name);
  r.str("model_path", &m.path);
  r.str("model_sha256", &m.sha256);
  r.str("architecture", &m.architecture);
  r.str("dtype", &m.dtype);
  r.str("device", &m.device);
  r.i64("n_layers", &m.n_layers);
  r.i64("n_heads", &m.n_heads);
  r.i64("n_kv_heads", &m.n_kv_heads);
  r.i64("head_dim", &m.head_dim);
  r.i64("vocab_size", &m.vocab_size);
  r.i64("context_length", &m.context_length);
  r.i64("max_tokens", &layout->max_tokens);
  r.str("policy", &run->policy);
  r.str("policy_name", &run->policy_name);
  r.str("policy_params", &run->policy_params_json);
  r.str("budget_kind", &run->budget_kind);
  r.i64("budget", &run->budget);
  int64_t seed = 0;
  r.i64("seed", &seed);
  run->seed = static_cast<uint64_t>(seed);
  r.str("prompt", &run->prompt);
  r.str("capture_levels", &run->capture_levels);
  r.str("command_line", &run->command_line);
  // The creation time is a root attribute (written by every version).
  h5::read_attr_string(file, "created_utc", &run->created_utc);
  r.str("run_json", &run->run_json);
  r.strs("tier_names", &run->tier_names, kMaxTiers);
  r.strs("reason_names", &run->reason_names, kMaxReasons);
  r.str("tool_version", &run->tool_version);
  r.str("task_kind", &run->task_kind);
  r.str("expected_answer", &run->expected_answer);
  if (problems->size() != before) return;

  r.range("n_layers", m.n_layers, 1, kMaxLayers);
  r.range("n_heads", m.n_heads, 1, kMaxHeads);
  r.range("n_kv_heads", m.n_kv_heads, 1, std::max<int64_t>(1, std::min(m.n_heads, kMaxHeads)));
  if (m.n_kv_heads >= 1 && m.n_heads >= 1 && m.n_heads % m.n_kv_heads != 0)
    r.problem(ErrorCode::Schema, "n_kv_heads",
              "is " + std::to_string(m.n_kv_heads) +
                  " (expected a divisor of n_heads = " + std::to_string(m.n_heads) + ")");
  r.range("max_tokens", layout->max_tokens, 1, kMaxTokens);
  r.range("head_dim", m.head_dim, 1, kMaxHeadDim);
  r.range("vocab_size", m.vocab_size, 1, kMaxVocab);
  r.range("context_length", m.context_length, 1, kMaxTokens);
  r.range("budget", run->budget, 0, kMaxTokens * kMaxLayers * kMaxHeads);
  if (run->budget_kind != "none" && run->budget_kind != "head" && run->budget_kind != "layer" &&
      run->budget_kind != "global")
    r.problem(ErrorCode::Schema, "budget_kind",
              "is \"" + run->budget_kind + "\" (expected none, head, layer or global)");
  read_tier_attended(file, g.get(), run, problems);
  read_storage_formats(file, g.get(), run, problems);
  read_layer_types(file, g.get(), run, problems);
  if (problems->size() != before) return;
  read_layout(file, *run, layout, problems);
  if (problems->size() != before) return;
  check_declared_groups(file, *run, *layout, problems);
}

}  // namespace kvscope::trace
