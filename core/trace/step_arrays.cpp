#include "core/trace/step_arrays.h"

#include <limits>

#include "core/trace/error.h"
#include "core/trace/row_tables.h"

namespace kvscope::trace {

void StepArrays::init(std::string trace_path, const RunInfo& run, const CaptureLayout& capture,
                      std::unordered_map<std::string, AppendColumn>& columns) {
  path = std::move(trace_path);
  layout = capture;
  L = run.model.n_layers;
  H = run.model.n_heads;
  K = run.model.n_kv_heads;
  R = static_cast<int64_t>(run.tier_names.size());
  const auto column = [&](const std::string& p) {
    auto it = columns.find(p);
    return it == columns.end() ? nullptr : &it->second;
  };
  occupancy = column("/occupancy/entries");
  tier_bytes = column("/occupancy/tier_bytes");
  received_token = column("/attention/received/token");
  received_mass = column("/attention/received/mass");
  received_offset = column("/attention/received/offset");
  received_count = column("/attention/received/count");
  topk_index = column("/attention/topk/index");
  topk_weight = column("/attention/topk/weight");
  oracle_kl = column("/oracle/kl");
  oracle_lost = column("/oracle/lost_mass");
  oracle_recall = column("/oracle/recall");
  for (const SeriesSpec& sp : layout.series)
    series_columns.push_back(column("/series/" + sp.name + "/value"));
  series_nan_row.assign(static_cast<size_t>(L * K), std::numeric_limits<float>::quiet_NaN());
}

void StepArrays::append(const StepData& sd) {
  append_occupancy(sd);
  if (layout.received) append_received(sd);
  if (layout.topk > 0) append_topk(sd);
  if (!layout.series.empty()) append_series(sd);
  if (layout.oracle) append_oracle(sd);
}

void StepArrays::fail(const std::string& field, const std::string& what) const {
  throw TraceError(ErrorCode::Usage, path, field, what);
}

void StepArrays::check_head(const std::string& field, int64_t layer, int64_t kv_head) const {
  if (std::string why = head_problem(layer, kv_head, L, K); !why.empty()) fail(field, why);
}

void StepArrays::append_occupancy(const StepData& sd) {
  if (static_cast<int64_t>(sd.occupancy.size()) != L * K * R)
    fail("/occupancy/entries", "step carries " + std::to_string(sd.occupancy.size()) +
                                   " values, expected L*K*R = " + std::to_string(L * K * R));
  occupancy->push(sd.occupancy.data(), 1);
  std::vector<int64_t> bytes = sd.tier_bytes;
  bytes.resize(static_cast<size_t>(R), 0);
  tier_bytes->push(bytes.data(), 1);
}

// One [L, K] row per series and step; a step that carries no values gets
// NaN rows, so every series keeps one row per step.
void StepArrays::append_series(const StepData& sd) {
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

void StepArrays::append_received(const StepData& sd) {
  std::vector<int64_t> offset(static_cast<size_t>(L * K), received_rows_appended);
  std::vector<int32_t> count(static_cast<size_t>(L * K), 0);
  for (const ReceivedRow& row : sd.received) {
    check_head("/attention/received", row.layer, row.kv_head);
    if (row.tokens.size() != row.mass.size())
      fail("/attention/received/mass", "tokens and mass differ in length");
    size_t slot = static_cast<size_t>(row.layer * K + row.kv_head);
    offset[slot] = received_rows_appended;
    count[slot] = static_cast<int32_t>(row.tokens.size());
    received_token->push(row.tokens.data(), row.tokens.size());
    received_mass->push(row.mass.data(), row.mass.size());
    received_rows_appended += static_cast<int64_t>(row.tokens.size());
  }
  received_offset->push(offset.data(), 1);
  received_count->push(count.data(), 1);
}

void StepArrays::append_topk(const StepData& sd) {
  int64_t k = layout.topk;
  for (const TopkRow& row : sd.topk) {
    if (row.token != topk_rows_appended)
      fail("/attention/topk/index",
           "rows must arrive in token order; expected token " + std::to_string(topk_rows_appended));
    if (static_cast<int64_t>(row.index.size()) != L * H * k ||
        static_cast<int64_t>(row.weight.size()) != L * H * k)
      fail("/attention/topk/index", "row must hold L * H * k values");
    topk_index->push(row.index.data(), 1);
    topk_weight->push(row.weight.data(), 1);
    ++topk_rows_appended;
  }
}

void StepArrays::append_oracle(const StepData& sd) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lost(static_cast<size_t>(L * H), nan), recall(static_cast<size_t>(L * K), nan);
  float kl = nan;
  if (sd.has_oracle) {
    if (static_cast<int64_t>(sd.oracle.lost_mass.size()) != L * H ||
        static_cast<int64_t>(sd.oracle.recall.size()) != L * K)
      fail("/oracle", "lost_mass must hold L*H and recall L*K values");
    lost = sd.oracle.lost_mass;
    recall = sd.oracle.recall;
    kl = sd.oracle.kl;
  }
  oracle_kl->push1(kl);
  oracle_lost->push(lost.data(), 1);
  oracle_recall->push(recall.data(), 1);
}

}  // namespace kvscope::trace
