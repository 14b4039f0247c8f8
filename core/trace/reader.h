// TraceReader: the only way views, tools and tests read a trace. Every
// accessor reads just the slice it is asked for (chunk-aligned hyperslabs);
// nothing loads a whole large dataset to answer a small question. Opening
// checks the format name and version and gives "not a KVScope trace",
// "too new" or "too old" errors naming the file.
//
// A reader can follow a capture in progress: refresh() picks up steps the
// writer flushed since. Counts are of committed steps only (see writer.h).
//
// Not thread-safe: use one reader per thread (the GUI reads on one worker).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/trace/types.h"

namespace kvscope::trace {

struct OpenedTrace;  // open.h

struct HeadLifetimes {
  int64_t token_begin = 0;
  std::vector<int32_t> admit_step;  // per token, -1 never admitted
  std::vector<int32_t> evict_step;  // per token, -1 never evicted
};

struct PooledTile {
  int64_t qb_begin = 0, qb_end = 0, kb_begin = 0, kb_end = 0;
  std::vector<float> max;  // (qb_end - qb_begin) x (kb_end - kb_begin), row-major
  std::vector<float> mean;
};

class TraceReader {
 public:
  // Largest single read the reader will allocate for; bigger requests throw
  // TraceError(TooLarge) instead of allocating.
  static constexpr int64_t kMaxReadBytes = int64_t(1) << 30;

  static std::unique_ptr<TraceReader> open(const std::string& path);
  // A trace held in memory as a file image (`name` in messages): `data` must
  // outlive the reader, and refresh() finds nothing new.
  static std::unique_ptr<TraceReader> open_image(const std::string& name, const void* data,
                                                 size_t size);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const std::string& path() const;
  int64_t format_version() const;
  int64_t format_minor_version() const;
  std::string writer() const;
  const RunInfo& run() const;
  const CaptureLayout& layout() const;
  int64_t n_layers() const { return run().model.n_layers; }
  int64_t n_heads() const { return run().model.n_heads; }
  int64_t n_kv_heads() const { return run().model.n_kv_heads; }
  int64_t n_tiers() const { return static_cast<int64_t>(run().tier_names.size()); }
  // One flag per tier (minor version 3): 1 the policy's attention reads the
  // tier's entries, 0 they are held unread until promoted. All 1 for older
  // traces.
  const std::vector<uint8_t>& tier_attended() const { return run().tier_attended; }

  // Re-reads extents and the complete flag (for traces still being written).
  void refresh();
  bool complete() const;
  std::string finish_reason() const;
  int8_t task_success() const;
  // Share of the task's expected answers the generation contains (minor
  // version 6). Older traces: 1 or 0 from task_success; NaN when there is no
  // task or the capture did not finish.
  double task_score() const;
  // The expected answer's teacher-forced log-probability and its first
  // token's rank at the answer step (minor version 10; NaN and -1 when not
  // measured or older).
  double answer_logprob() const;
  int64_t answer_rank() const;

  int64_t n_steps() const;   // committed steps
  int64_t n_tokens() const;  // tokens fed by committed steps
  int64_t n_events() const;  // events of committed steps

  std::vector<StepRecord> steps(int64_t begin, int64_t end) const;
  std::vector<TokenRecord> tokens(int64_t begin, int64_t end) const;
  std::vector<Event> events(int64_t begin, int64_t end) const;
  std::vector<Event> step_events(int64_t step) const;
  // Single columns, for scans that need one field of many rows.
  std::vector<uint8_t> event_kinds(int64_t begin, int64_t end) const;
  std::vector<uint8_t> token_roles(int64_t begin, int64_t end) const;

  HeadLifetimes lifetimes(int layer, int kv_head, int64_t token_begin = 0,
                          int64_t token_end = -1) const;
  // Tier residences of one head (tiered traces; empty otherwise).
  std::vector<TierInterval> intervals(int layer, int kv_head) const;

  std::vector<int32_t> occupancy(int64_t step) const;  // L*K*R
  // Entries of head (layer, kv_head) per tier over steps [begin, end): (end-begin)*R.
  std::vector<int32_t> occupancy_series(int layer, int kv_head, int64_t begin, int64_t end) const;
  std::vector<int64_t> tier_bytes(int64_t begin, int64_t end) const;  // (end-begin)*R

  ReceivedRow received(int64_t step, int layer, int kv_head) const;

  int64_t pooled_query_blocks() const;  // blocks written so far
  int64_t pooled_key_blocks() const;
  PooledTile pooled(int layer, int head, int64_t qb_begin, int64_t qb_end, int64_t kb_begin,
                    int64_t kb_end) const;

  // Rows [token_begin, token_end) of dense head `head_index`: count x max_tokens.
  std::vector<float> dense_rows(int head_index, int64_t token_begin, int64_t token_end) const;
  TopkRow topk(int64_t token) const;

  int gate_index(const std::string& name) const;  // -1 when absent
  std::vector<float> gate_values(int gate, int layer, int kv_head, int64_t token_begin = 0,
                                 int64_t token_end = -1) const;
  int64_t gate_sample_count(int gate) const;
  std::vector<GateValue> gate_samples(int gate, int64_t begin, int64_t end,
                                      std::vector<int32_t>* steps = nullptr) const;

  // Per-step policy values (/series, minor version 2): empty for traces
  // whose policy declared none and for older traces.
  const std::vector<SeriesSpec>& series() const { return layout().series; }
  int series_index(const std::string& name) const;  // -1 when absent
  // Steps [begin, end) of series `series`: (end-begin)*L*K, [step][layer][kv head], NaN where
  // the policy recorded nothing.
  std::vector<float> series_values(int series, int64_t begin, int64_t end) const;
  // Head (layer, kv_head) of series `series` over steps [begin, end): end-begin values.
  std::vector<float> series_head(int series, int layer, int kv_head, int64_t begin,
                                 int64_t end) const;

  // The committed rows of a table of step rows (row_tables.h's
  // KVSCOPE_STEP_TABLES: StallRow, MergeRow, RerotationRow, ReconstructionRow,
  // KeyChannelRow), in step order; none in traces older than the table.
  template <typename Row>
  std::vector<Row> rows() const;
  template <typename Row>
  std::vector<Row> rows_of_step(int64_t step) const;
  template <typename Row>
  int64_t row_count() const;
  // The committed rows of the step table of group `group` ("/stalls"), by name.
  int64_t table_row_count(const std::string& group) const;

  // Reactive fetches of entries the policy did not attend (/stalls, minor version 3).
  int64_t n_stalls() const { return row_count<StallRow>(); }
  std::vector<StallRow> stalls() const { return rows<StallRow>(); }
  std::vector<StallRow> stalls_of_step(int64_t step) const { return rows_of_step<StallRow>(step); }
  // Entries folded into others as they left (/merges, minor version 4).
  int64_t n_merges() const { return row_count<MergeRow>(); }
  std::vector<MergeRow> merges() const { return rows<MergeRow>(); }
  std::vector<MergeRow> merges_of_step(int64_t step) const { return rows_of_step<MergeRow>(step); }
  // Cached keys re-rotated to another RoPE position (/rerotations, minor version 4).
  int64_t n_rerotations() const { return row_count<RerotationRow>(); }
  std::vector<RerotationRow> rerotations() const { return rows<RerotationRow>(); }
  // Key channels heads stopped storing (/key_channels, minor version 7).
  int64_t n_pruned_key_channels() const { return row_count<KeyChannelRow>(); }
  std::vector<KeyChannelRow> pruned_key_channels() const { return rows<KeyChannelRow>(); }
  // Tokens of the context-reconstruction steps (/reconstruction, minor version 5).
  int64_t n_reconstruction_tokens() const { return row_count<ReconstructionRow>(); }
  std::vector<ReconstructionRow> reconstruction_tokens() const { return rows<ReconstructionRow>(); }
  // Decisions a replay's interventions changed (/interventions, minor version 10).
  int64_t n_interventions() const { return row_count<InterventionRow>(); }
  std::vector<InterventionRow> interventions() const { return rows<InterventionRow>(); }

  std::vector<float> oracle_kl(int64_t begin, int64_t end) const;
  std::vector<float> oracle_lost_mass(int64_t step) const;  // L*H
  std::vector<float> oracle_recall(int64_t step) const;     // L*K

  std::string generated_text() const;
  int64_t file_bytes() const;

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  static std::unique_ptr<TraceReader> from_opened(const std::string& path, OpenedTrace opened);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvscope::trace
