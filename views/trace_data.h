// What views read from one trace, cached: the reader, token and step tables,
// lifetimes of all heads, the level-of-detail cache. Used by one thread at a
// time (the GUI's worker, or `kvscope export`), except the LOD pointer, which
// the builder thread sets when the cache is ready.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/analysis/attention_lod.h"
#include "core/analysis/lifetimes.h"
#include "core/analysis/survival.h"
#include "core/trace/reader.h"

namespace kvscope::views {

struct TraceBasics {
  int64_t n_steps = 0, n_tokens = 0;
  std::vector<trace::TokenRecord> tokens;
  std::vector<trace::StepRecord> steps;
  std::vector<int32_t> fed_step;  // step that fed token t
};

class TraceData {
 public:
  explicit TraceData(std::unique_ptr<trace::TraceReader> reader);
  // Borrows a reader the caller keeps alive.
  explicit TraceData(const trace::TraceReader& reader);

  const trace::TraceReader& reader() const { return *reader_; }
  trace::TraceReader& mutable_reader() { return *owned_; }
  // Re-reads extents of a live trace; drops caches when it grew. Returns true
  // when there are new steps (or the trace became complete).
  bool refresh();

  const TraceBasics& basics();
  const analysis::AllLifetimes& all_lifetimes();
  // Cached per head: the attention criterion's last positions for one kv head.
  const analysis::LastAttended& last_attended(int layer, int kv_head);

  // Another open trace (the compared one); set by whoever owns the readers.
  std::function<TraceData&(const std::string&)> peer;

  std::shared_ptr<const analysis::AttentionLod> lod() const;
  void set_lod(std::shared_ptr<const analysis::AttentionLod> lod);

 private:
  void drop_caches();
  std::unique_ptr<trace::TraceReader> owned_;
  const trace::TraceReader* reader_;
  std::unique_ptr<TraceBasics> basics_;
  std::unique_ptr<analysis::AllLifetimes> all_;
  std::map<std::pair<int, int>, analysis::LastAttended> last_attended_;
  mutable std::mutex lod_mutex_;
  std::shared_ptr<const analysis::AttentionLod> lod_;
};

}  // namespace kvscope::views
