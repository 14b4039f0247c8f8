// The writer's pooled and dense attention rows: queued between flushes,
// checked as they come and written in place at a flush (a pooled block of
// queries is rewritten as its partial rows fill up). Internal to core/trace.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/trace/types.h"

namespace kvscope::trace {

struct AttentionMaps {
  void init(std::string trace_path, const CaptureLayout& capture_layout, int64_t layers,
            int64_t heads, int64_t n_key_blocks);
  // Throw TraceError(Usage) naming the trace and field of a malformed row.
  void queue_pooled(const PooledRow& row);
  void queue_dense(const DenseRow& row, int64_t tokens_fed);
  // Write what was queued into /attention/pooled/{max,mean} and
  // /attention/dense/weight; throw TraceError(Io) when HDF5 fails.
  void write_pooled(hid_t dmax, hid_t dmean);
  void write_dense(hid_t d);

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;
  [[noreturn]] void io_fail(const std::string& field) const;

  std::string path;
  CaptureLayout layout;
  int64_t L = 0, H = 0, key_blocks = 0;
  std::map<std::pair<int, int>, PooledRow> pending_pooled;  // (layer, block)
  hsize_t pooled_blocks_on_disk = 0;
  std::vector<DenseRow> pending_dense;
  hsize_t dense_tokens_on_disk = 0;
};

}  // namespace kvscope::trace
