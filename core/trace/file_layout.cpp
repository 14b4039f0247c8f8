#include "core/trace/file_layout.h"

#include <algorithm>
#include <regex>

#include "core/trace/error.h"
#include "core/trace/h5.h"
#include "kvscope_version.h"

namespace kvscope::trace {

namespace {

// Names become HDF5 group names under `group` (and paths in messages).
void check_group_names(const std::string& path, const std::string& group, const std::string& what,
                       const std::string& plural, const std::vector<std::string>& names) {
  const auto fail = [&](const std::string& field, const std::string& why) {
    throw TraceError(ErrorCode::Usage, path, field, why);
  };
  static const std::regex name_pattern("[A-Za-z0-9_-]{1,64}");
  for (size_t i = 0; i < names.size(); ++i) {
    if (!std::regex_match(names[i], name_pattern))
      fail(group + "/" + names[i], what + " names must match [A-Za-z0-9_-]{1,64}");
    if (std::find(names.begin(), names.begin() + long(i), names[i]) != names.begin() + long(i))
      fail(group + "/" + names[i], "declared twice (" + what + " names must be unique)");
  }
  if (names.size() > 64) fail(group, "at most 64 " + plural);
}

void write_series_attributes(hid_t file, const CaptureLayout& layout) {
  if (layout.series.empty()) return;  // no /series group
  // Series indices (the blocks of StepData::series) follow this order.
  std::vector<std::string> names;
  for (const SeriesSpec& series : layout.series) names.push_back(series.name);
  h5::Handle g = h5::group(H5Gopen2(file, "/series", H5P_DEFAULT));
  h5::write_attr_strings(g.get(), "order", names);
  for (const SeriesSpec& series : layout.series) {
    h5::Handle sg = h5::group(H5Gopen2(file, ("/series/" + series.name).c_str(), H5P_DEFAULT));
    h5::write_attr_string(sg.get(), "meaning", series.meaning);
    h5::write_attr_string(sg.get(), "units", series.units);
  }
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

void set_fill(hid_t dcpl, const DatasetSpec& spec) {
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

}  // namespace

h5::Handle create_group(hid_t file, const std::string& path, const std::string& group_path,
                        const std::string& meaning) {
  h5::Handle lcpl = h5::plist(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  h5::Handle g =
      h5::group(H5Gcreate2(file, group_path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!g) throw TraceError(ErrorCode::Io, path, group_path, h5::take_error_message());
  if (!meaning.empty()) h5::write_attr_string(g.get(), "meaning", meaning);
  return g;
}

h5::Handle create_dataset(hid_t file, const std::string& path, const DatasetSpec& spec,
                          const AxisSizes& axes, int compression_level,
                          std::vector<hsize_t>* dims_out) {
  std::vector<hsize_t> dims, maxdims;
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    Axis a = spec.dims[i];
    hsize_t n = axis_grows(a) ? 0 : static_cast<hsize_t>(axes[a]);
    dims.push_back(n);
    maxdims.push_back(axis_grows(a) ? H5S_UNLIMITED : n);
  }
  h5::Handle space =
      h5::dataspace(spec.dims.empty() ? H5Screate(H5S_SCALAR)
                                      : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                         maxdims.data()));
  h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  if (!spec.dims.empty()) {
    std::vector<hsize_t> chunk = chunk_shape(spec, dims);
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (compression_level > 0 && spec.compress) {
      H5Pset_shuffle(dcpl.get());
      H5Pset_deflate(dcpl.get(), static_cast<unsigned>(compression_level));
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
  h5::Handle d = h5::dataset(H5Dcreate2(file, spec.path.c_str(), h5::file_type(spec.elem),
                                        space.get(), lcpl.get(), dcpl.get(), dapl.get()));
  if (!d) throw TraceError(ErrorCode::Io, path, spec.path, h5::take_error_message());
  h5::write_attr_string(d.get(), "units", spec.units);
  h5::write_attr_string(d.get(), "meaning", spec.meaning);
  std::string axes_text;
  for (size_t i = 0; i < spec.dims.size(); ++i)
    axes_text += std::string(i ? "," : "") + axis_label(spec, i);
  h5::write_attr_string(d.get(), "axes", axes_text);

  *dims_out = dims;
  return d;
}

void check_run_for_writing(const std::string& path, const RunInfo& run,
                           const CaptureLayout& layout) {
  const auto fail = [&](const std::string& field, const std::string& what) {
    throw TraceError(ErrorCode::Usage, path, field, what);
  };
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
  check_group_names(path, "/gates", "gate", "gates", gate_names);
  check_group_names(path, "/series", "series", "series", series_names);
  for (auto [l, h] : layout.dense_heads)
    if (l < 0 || l >= m.n_layers || h < 0 || h >= m.n_heads)
      fail("/attention/dense/heads", "(layer, head) out of range");
  if (layout.topk < 0 || layout.topk > 1024) fail("/attention/topk", "k must be 0..1024");
  if (layout.pooled_block < 0) fail("/attention/pooled", "block must be >= 0");
}

void write_run_attributes(hid_t file, const RunInfo& run, const CaptureLayout& layout) {
  h5::Handle root = h5::group(H5Gopen2(file, "/", H5P_DEFAULT));
  h5::write_attr_string(root.get(), "format", kFormatName);
  h5::write_attr_i64(root.get(), "version", kFormatVersion);
  h5::write_attr_i64(root.get(), "minor_version", kFormatMinorVersion);
  h5::write_attr_string(root.get(), "writer", std::string("kvscope ") + KVSCOPE_VERSION_STRING);
  h5::write_attr_string(root.get(), "created_utc", run.created_utc);

  h5::Handle g = h5::group(H5Gopen2(file, "/run", H5P_DEFAULT));
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
  h5::write_attr_strings(r, "layer_ffn",
                         m.layer_ffn.empty() ? std::vector<std::string>(L, "dense") : m.layer_ffn);
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

void write_layout_attributes(hid_t file, const CaptureLayout& layout, const AxisSizes& axes,
                             hid_t dense_heads) {
  if (layout.pooled_block > 0) {
    h5::Handle g = h5::group(H5Gopen2(file, "/attention/pooled", H5P_DEFAULT));
    h5::write_attr_i64(g.get(), "block", layout.pooled_block);
    h5::write_attr_i64(g.get(), "key_blocks", axes[Axis::KeyBlocks]);
  }
  if (layout.topk > 0) {
    h5::Handle g = h5::group(H5Gopen2(file, "/attention/topk", H5P_DEFAULT));
    h5::write_attr_i64(g.get(), "k", layout.topk);
  }
  if (layout.oracle) {
    h5::Handle g = h5::group(H5Gopen2(file, "/oracle", H5P_DEFAULT));
    h5::write_attr_i64(g.get(), "recall_k", layout.oracle_recall_k);
  }
  if (!layout.dense_heads.empty()) {
    std::vector<int32_t> pairs;
    for (auto [l, h] : layout.dense_heads) {
      pairs.push_back(l);
      pairs.push_back(h);
    }
    H5Dwrite(dense_heads, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, pairs.data());
  }
  {
    // Gate indices (GateValue::gate) follow this order, not HDF5's name order.
    std::vector<std::string> names;
    for (const GateSpec& gate : layout.gates) names.push_back(gate.name);
    h5::Handle g = h5::group(H5Gopen2(file, "/gates", H5P_DEFAULT));
    h5::write_attr_strings(g.get(), "order", names);
  }
  for (const GateSpec& gate : layout.gates) {
    h5::Handle g = h5::group(H5Gopen2(file, ("/gates/" + gate.name).c_str(), H5P_DEFAULT));
    h5::write_attr_string(g.get(), "meaning", gate.meaning);
    h5::write_attr_string(g.get(), "units", gate.units);
    h5::write_attr_f64(g.get(), "threshold", gate.threshold);
    h5::write_attr_i64(g.get(), "time_varying", gate.time_varying ? 1 : 0);
  }
  write_series_attributes(file, layout);
}

}  // namespace kvscope::trace
