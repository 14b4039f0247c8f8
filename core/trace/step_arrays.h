// What a step records beyond its rows and tokens: entries per head and tier,
// the policy's series, attention received, top-k keys and the oracle's
// verdicts, one row per step (top-k: per token), checked as they come and
// buffered in the writer's columns. Internal to core/trace.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/trace/append_column.h"
#include "core/trace/types.h"

namespace kvscope::trace {

class StepArrays {
 public:
  // The columns the layout declared, taken from the writer's `columns`.
  void init(std::string trace_path, const RunInfo& run, const CaptureLayout& capture,
            std::unordered_map<std::string, AppendColumn>& columns);
  // Throws TraceError(Usage) naming the field of a step that does not fit the layout.
  void append(const StepData& sd);

 private:
  void append_occupancy(const StepData& sd);
  void append_series(const StepData& sd);
  void append_received(const StepData& sd);
  void append_topk(const StepData& sd);
  void append_oracle(const StepData& sd);
  [[noreturn]] void fail(const std::string& field, const std::string& what) const;
  void check_head(const std::string& field, int64_t layer, int64_t kv_head) const;

  std::string path;
  CaptureLayout layout;
  int64_t L = 0, H = 0, K = 0, R = 0;
  AppendColumn *occupancy = nullptr, *tier_bytes = nullptr;
  AppendColumn *received_token = nullptr, *received_mass = nullptr, *received_offset = nullptr,
               *received_count = nullptr;
  AppendColumn *topk_index = nullptr, *topk_weight = nullptr;
  AppendColumn *oracle_kl = nullptr, *oracle_lost = nullptr, *oracle_recall = nullptr;
  std::vector<AppendColumn*> series_columns;  // /series/<name>/value, in layout order
  std::vector<float> series_nan_row;          // [L, K] of NaN, for steps without values
  int64_t received_rows_appended = 0;
  int64_t topk_rows_appended = 0;
};

}  // namespace kvscope::trace
