// How the writer lays a new trace out: what it refuses in a run before
// creating a file, the groups and datasets the schema names (chunking, fill,
// compression, their attributes), and the root, /run and layout attributes
// (read back by open.cpp). Internal to core/trace.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "core/trace/h5.h"
#include "core/trace/schema.h"
#include "core/trace/types.h"

namespace kvscope::trace {

// A group with its meaning; throws TraceError(Io) naming `path` (the trace).
h5::Handle create_group(hid_t file, const std::string& path, const std::string& group_path,
                        const std::string& meaning);
// A dataset as the schema declares it, its growth axes empty; *dims_out its
// initial extent. Throws TraceError(Io) naming `path` and the dataset.
h5::Handle create_dataset(hid_t file, const std::string& path, const DatasetSpec& spec,
                          const AxisSizes& axes, int compression_level,
                          std::vector<hsize_t>* dims_out);
// Throws TraceError(Usage) naming `path` and the /run field a writer cannot hold.
void check_run_for_writing(const std::string& path, const RunInfo& run,
                           const CaptureLayout& layout);
// The root attributes (format, versions, writer) and /run's.
void write_run_attributes(hid_t file, const RunInfo& run, const CaptureLayout& layout);
// The optional groups' attributes (pooled block, top-k k, oracle recall k,
// gate and series descriptions) and /attention/dense/heads (`dense_heads`,
// -1 when the layout has none).
void write_layout_attributes(hid_t file, const CaptureLayout& layout, const AxisSizes& axes,
                             hid_t dense_heads);

}  // namespace kvscope::trace
