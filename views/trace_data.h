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

  // The first decode step (the answer's first token; -1: none yet).
  int64_t first_decode_step() const {
    for (size_t s = 0; s < steps.size(); ++s)
      if (steps[s].kind == trace::StepKind::Decode) return int64_t(s);
    return -1;
  }
};

// A level-of-detail cache under construction: each head's thumbnail and
// metrics as the build finishes it, so the overview shows heads first and
// the cache fills in (coarse first, never waiting on the whole build).
class PartialLod {
 public:
  PartialLod(int64_t layers, int64_t heads);
  void add(int layer, int head, const analysis::AttentionGrid& thumbnail,
           const std::vector<float>& metrics);
  int64_t layers() const { return layers_; }
  int64_t heads() const { return heads_; }
  int64_t done() const;
  // Copies of head (layer, head)'s thumbnail and metrics; false when not done.
  bool get(int layer, int head, analysis::AttentionGrid* thumbnail,
           std::vector<float>* metrics) const;

 private:
  mutable std::mutex mutex_;
  int64_t layers_, heads_, done_ = 0;
  std::vector<analysis::AttentionGrid> thumbs_;  // L*H
  std::vector<float> metrics_;                   // L*H*kMetricCount
  std::vector<uint8_t> have_;                    // L*H
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
  // Cached per token set: the received mass on `tokens` (mean over kv heads)
  // at every step from the first decode step on, NaN before (the compare
  // view's span curve; reading it is a pass over the trace's attention).
  const std::vector<double>& span_mass(const std::vector<int32_t>& tokens);

  // Another open trace (the compared one); set by whoever owns the readers.
  std::function<TraceData&(const std::string&)> peer;

  std::shared_ptr<const analysis::AttentionLod> lod() const;
  void set_lod(std::shared_ptr<const analysis::AttentionLod> lod);
  // While the cache is being built: the heads done so far (null when none).
  std::shared_ptr<const PartialLod> partial_lod() const;
  void set_partial_lod(std::shared_ptr<const PartialLod> partial);

 private:
  void drop_caches();
  std::unique_ptr<trace::TraceReader> owned_;
  const trace::TraceReader* reader_;
  std::unique_ptr<TraceBasics> basics_;
  std::unique_ptr<analysis::AllLifetimes> all_;
  std::map<std::pair<int, int>, analysis::LastAttended> last_attended_;
  std::map<std::vector<int32_t>, std::vector<double>> span_mass_;
  mutable std::mutex lod_mutex_;
  std::shared_ptr<const analysis::AttentionLod> lod_;
  std::shared_ptr<const PartialLod> partial_lod_;
};

}  // namespace kvscope::views
