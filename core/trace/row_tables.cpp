#include "core/trace/row_tables.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/common/check.h"

// The declarations below are laid out as tables, one column per entry.
// clang-format off
namespace kvscope::trace {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The rows a step carries in StepData's field `Field`.
template <typename Row, std::vector<Row> StepData::*Field>
std::pair<const void*, size_t> step_rows(const StepData& step) {
  const std::vector<Row>& rows = step.*Field;
  return {rows.data(), rows.size()};
}

// step, layer, kv_head: the columns every per-head step table starts with.
template <typename Row>
std::vector<ColumnSpec> head_columns(const std::string& step_meaning) {
  return {column<&Row::step>("step", "step", step_meaning, int_range(0, Limit::Steps)),
          column<&Row::layer>("layer", "layer", "layer index", int_range(0, Limit::Layers)),
          column<&Row::kv_head>("kv_head", "kv head", "key/value head index",
                                int_range(0, Limit::KvHeads))};
}

template <typename Row>
RowTableSpec table(std::string group, std::string meaning, std::string noun, std::string symbol,
                   int since_minor) {
  RowTableSpec t;
  t.group = std::move(group);
  t.meaning = std::move(meaning);
  t.noun = std::move(noun);
  t.rows_symbol = std::move(symbol);
  t.since_minor = since_minor;
  t.row_size = sizeof(Row);
  return t;
}

RowTableSpec make_events() {
  RowTableSpec t = table<Event>(
      "/events", "every policy decision: admit, reject, select, evict, demote, promote", "event",
      "E", 0);
  t.chunk = 16384;
  const Range tier = int_range(0, Limit::Tiers, 0, kNoTier, "a tier of tier_names or 255");
  t.columns = {
      column<&Event::step>("step", "step", "step of the decision", int_range(0, Limit::Steps)),
      column<&Event::layer>("layer", "layer", "layer index", int_range(0, Limit::Layers)),
      column<&Event::kv_head>("kv_head", "kv head", "key/value head index",
                              int_range(0, Limit::KvHeads)),
      column<&Event::token>("token", "token index", "token the decision is about",
                            int_range(0, Limit::Tokens)),
      column<&Event::kind>("kind", "enum", "0 admit, 1 reject, 2 select, 3 evict, 4 demote, 5 promote",
                           int_range(0, Limit::EventKinds, 0, INT64_MIN, "a kind 0 .. 5")),
      column<&Event::score>("score", "policy-defined",
                            "score behind the decision (NaN when the policy has none)", {}, kNaN),
      column<&Event::reason>("reason", "enum", "index into /run reason_names",
                             int_range(0, Limit::Reasons, 0, INT64_MIN, "an index into reason_names")),
      column<&Event::from_tier>("from_tier", "tier", "tier before the decision, 255 = not cached",
                                tier, 255),
      column<&Event::to_tier>("to_tier", "tier", "tier after the decision, 255 = not cached", tier,
                              255)};
  return t;
}

RowTableSpec make_intervals() {
  RowTableSpec t = table<TierInterval>("/lifetimes/intervals",
                                       "tier residences, for policies with more than one tier",
                                       "interval", "I", 0);
  t.chunk = 16384;
  t.feature = Feature::Tiered;
  t.step_rows = false;  // written as heads' residences close, sorted by head at the end
  t.columns = {
      column<&TierInterval::layer>("layer", "layer", "layer index", int_range(0, Limit::Layers)),
      column<&TierInterval::kv_head>("kv_head", "kv head", "key/value head index",
                                     int_range(0, Limit::KvHeads)),
      column<&TierInterval::token>("token", "token index", "token", int_range(0, Limit::Tokens)),
      column<&TierInterval::tier>("tier", "tier", "tier the token lived in",
                                  int_range(0, Limit::Tiers)),
      column<&TierInterval::begin_step>("begin_step", "step", "first step in the tier",
                                        int_range(0, Limit::Steps)),
      column<&TierInterval::end_step>("end_step", "step",
                                      "step it left the tier (exclusive), -1 if still there at the end",
                                      int_range(0, Limit::Steps, 1, -1), -1)};
  return t;
}

RowTableSpec make_stalls() {
  RowTableSpec t = table<StallRow>(
      "/stalls", "reactive fetches of entries the policy did not attend, one row each", "stall",
      "X", 3);
  t.rows_of = step_rows<StallRow, &StepData::stalls>;
  t.columns = head_columns<StallRow>("step that waited for the fetch (rows in step order)");
  t.columns.push_back(column<&StallRow::token>("token", "token index",
                                               "token fetched from a tier that is not attended",
                                               int_range(0, Limit::Tokens)));
  t.columns.push_back(column<&StallRow::wait_s>(
      "wait_s", "s", "how long the step waited for the entry (modelled or measured)",
      float_range(0, 1e12, false, "finite and >= 0")));
  t.columns.push_back(column<&StallRow::needed>(
      "needed", "enum",
      "oracle: 1 the full cache's attention on the token was at or above its head's 0.9 "
      "quantile in that step, 0 below, -1 no oracle",
      int_range(-1, Limit::Constant, 2, INT64_MIN, "-1, 0 or 1"), -1));
  return t;
}

RowTableSpec make_merges() {
  RowTableSpec t = table<MergeRow>(
      "/merges", "entries folded into another as they left (merging policies), one row each",
      "merge", "Y", 4);
  t.rows_of = step_rows<MergeRow, &StepData::merges>;
  t.columns = head_columns<MergeRow>("step whose eviction folded the entry (rows in step order)");
  t.columns.push_back(column<&MergeRow::token>(
      "token", "token index",
      "entry that left (an evict event of the step) with its value folded into `into`",
      int_range(0, Limit::Tokens)));
  t.columns.push_back(column<&MergeRow::into>("into", "token index",
                                              "entry of the same head that absorbed it and stays",
                                              int_range(0, Limit::Tokens)));
  t.columns.push_back(column<&MergeRow::weight>(
      "weight", "1", "weight of the folded value in the absorbing entry's blend",
      float_range(0, 1e30, false, "finite and >= 0")));
  t.check = [](const void* row, const RowContext&) -> RowProblem {
    const MergeRow& m = *static_cast<const MergeRow*>(row);
    if (m.into != m.token) return {};
    return {"/merges/into", "token " + std::to_string(m.into) + " for entry " + std::to_string(m.token) +
                        " (expected another token already fed)"};
  };
  return t;
}

RowTableSpec make_rerotations() {
  RowTableSpec t = table<RerotationRow>(
      "/rerotations", "cached keys re-rotated to another RoPE position, one row each",
      "re-rotation", "Z", 4);
  t.rows_of = step_rows<RerotationRow, &StepData::rerotations>;
  t.columns = head_columns<RerotationRow>("step that re-rotated the key (rows in step order)");
  t.columns.push_back(column<&RerotationRow::token>(
      "token", "token index", "entry whose cached key was re-rotated (the token stays the same)",
      int_range(0, Limit::Tokens)));
  t.columns.push_back(column<&RerotationRow::position>(
      "position", "position", "RoPE position the key carries from this step on",
      int_range(0, Limit::Tokens)));
  t.check = [](const void* row, const RowContext&) -> RowProblem {
    const RerotationRow& r = *static_cast<const RerotationRow*>(row);
    if (r.position >= 0 && r.position <= r.token) return {};
    return {"/rerotations/position", "position " + std::to_string(r.position) + " for token " +
                            std::to_string(r.token) + " (expected 0 .. the token's own position)"};
  };
  return t;
}

RowTableSpec make_reconstruction() {
  RowTableSpec t = table<ReconstructionRow>(
      "/reconstruction", "tokens of the context-reconstruction steps (KVzip), one row each",
      "reconstruction token", "C", 5);
  t.rows_of = step_rows<ReconstructionRow, &StepData::reconstruction>;
  t.columns = {
      column<&ReconstructionRow::step>(
          "step", "step",
          "context-reconstruction step (kind 2) that fed the token (rows in step order)",
          int_range(0, Limit::Steps)),
      column<&ReconstructionRow::position>(
          "position", "position",
          "RoPE position the token was fed at (from the step's first_token on; positions later "
          "sequence tokens take again)",
          int_range(0, Limit::MaxTokens)),
      column<&ReconstructionRow::id>(
          "id", "token id",
          "vocabulary id of the token (the repeat prompt and the context it reconstructs)",
          int_range(0, Limit::Vocab, 0, INT64_MIN, "an id of the vocabulary"))};
  // The step's tokens count up from its first_token (the step itself is
  // checked with the other step fields).
  t.check = [](const void* row, const RowContext& c) -> RowProblem {
    const ReconstructionRow& r = *static_cast<const ReconstructionRow*>(row);
    const int32_t want = c.step.first_token + static_cast<int32_t>(c.index);
    if (r.position == want) return {};
    return {"/reconstruction/position",
            "is " + std::to_string(r.position) + " (expected " + std::to_string(want) + ")"};
  };
  // A reconstruction step feeds no sequence tokens; its own tokens are rows
  // of this table, and only such a step has them.
  t.check_step = [](const StepData& sd, const RowContext& c) -> RowProblem {
    const bool kind = sd.step.kind == StepKind::Reconstruction;
    if (kind && sd.step.first_token != c.tokens_fed)
      return {"/steps/first_token", "a reconstruction step starts at the next sequence token " +
                                        std::to_string(c.tokens_fed)};
    if (kind && (sd.step.n_tokens != 0 || sd.reconstruction.empty()))
      return {"/reconstruction",
              "a reconstruction step feeds no sequence tokens and at least one reconstruction "
              "token"};
    if (!kind && !sd.reconstruction.empty())
      return {"/reconstruction", "a step that is no reconstruction step carries reconstruction "
                                 "tokens"};
    return {};
  };
  return t;
}

RowTableSpec make_key_channels() {
  RowTableSpec t = table<KeyChannelRow>(
      "/key_channels", "key channels a head stopped storing (ThinK), one row each",
      "pruned key channel", "P", 7);
  t.rows_of = step_rows<KeyChannelRow, &StepData::key_channels>;
  t.columns = head_columns<KeyChannelRow>("step that pruned the channel (rows in step order)");
  t.columns.push_back(column<&KeyChannelRow::channel>(
      "channel", "channel",
      "key channel (0 .. head_dim - 1) the head's keys in a pruned tier no longer store; they "
      "read 0 there",
      int_range(0, Limit::HeadDim, 0, INT64_MIN, "a channel 0 .. head_dim - 1")));
  return t;
}

RowTableSpec make_interventions() {
  RowTableSpec t = table<InterventionRow>(
      "/interventions",
      "decisions a replay's interventions changed (kvscope replay --intervene), one row each",
      "intervention", "V", 10);
  t.rows_of = step_rows<InterventionRow, &StepData::interventions>;
  t.columns = head_columns<InterventionRow>("step of the changed decision (rows in step order)");
  for (ColumnSpec c : {
           column<&InterventionRow::token>("token", "token index", "entry the decision was about",
                                           int_range(0, Limit::Tokens)),
           column<&InterventionRow::action>(
               "action", "enum",
               "0 kept (the policy's loss refused: the entry moved to the kept tier), 1 dropped",
               int_range(0, Limit::Constant, kInterventionActionCount, INT64_MIN, "0 or 1")),
           column<&InterventionRow::decision>(
               "decision", "enum",
               "the policy's decision it replaced, an /events kind (1 reject, 3 evict, 4 demote; "
               "dropped: 3)",
               int_range(0, Limit::EventKinds, 0, INT64_MIN, "a kind 0 .. 5")),
           column<&InterventionRow::reason>(
               "reason", "enum", "that decision's reason, an index into /run reason_names",
               int_range(0, Limit::Reasons, 0, INT64_MIN, "an index into reason_names")),
           column<&InterventionRow::intervention>(
               "intervention", "index", "the intervention, an index into /run run_json interventions",
               int_range(0, Limit::Constant, 1024)),
           column<&InterventionRow::score>(
               "score", "policy-defined", "the policy's score behind its decision (NaN: none)", {},
               kNaN)})
    t.columns.push_back(std::move(c));
  return t;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Range int_range(int64_t lo, Limit limit, int64_t offset, int64_t also, std::string expect) {
  Range r;
  r.kind = Range::Kind::Int;
  r.lo = lo;
  r.limit = limit;
  r.offset = offset;
  r.also = also;
  r.expect = std::move(expect);
  return r;
}

Range float_range(double lo, double hi, bool nan_ok, std::string expect) {
  Range r;
  r.kind = Range::Kind::Float;
  r.flo = lo;
  r.fhi = hi;
  r.nan_ok = nan_ok;
  r.expect = std::move(expect);
  return r;
}

LimitSizes limit_sizes(const RunInfo& run, const CaptureLayout& layout, int64_t steps,
                       int64_t tokens) {
  LimitSizes s;
  s[Limit::Steps] = steps;
  s[Limit::Layers] = run.model.n_layers;
  s[Limit::KvHeads] = run.model.n_kv_heads;
  s[Limit::Tokens] = tokens;
  s[Limit::MaxTokens] = layout.max_tokens;
  s[Limit::Vocab] = run.model.vocab_size;
  s[Limit::HeadDim] = run.model.head_dim;
  s[Limit::Tiers] = static_cast<int64_t>(run.tier_names.size());
  s[Limit::Reasons] = static_cast<int64_t>(run.reason_names.size());
  s[Limit::EventKinds] = kEventKindCount;
  return s;
}

const ColumnSpec* RowTableSpec::column(const std::string& name) const {
  for (const ColumnSpec& c : columns)
    if (c.name == name) return &c;
  return nullptr;
}

#define KVSCOPE_TABLE_OF(Row, make)                  \
  template <>                                        \
  const RowTableSpec& table_of<Row>() {              \
    static const RowTableSpec spec = make();         \
    return spec;                                     \
  }
KVSCOPE_TABLE_OF(Event, make_events)
KVSCOPE_TABLE_OF(TierInterval, make_intervals)
KVSCOPE_TABLE_OF(StallRow, make_stalls)
KVSCOPE_TABLE_OF(MergeRow, make_merges)
KVSCOPE_TABLE_OF(RerotationRow, make_rerotations)
KVSCOPE_TABLE_OF(ReconstructionRow, make_reconstruction)
KVSCOPE_TABLE_OF(KeyChannelRow, make_key_channels)
KVSCOPE_TABLE_OF(InterventionRow, make_interventions)
#undef KVSCOPE_TABLE_OF

const std::vector<const RowTableSpec*>& step_tables() {
  static const std::vector<const RowTableSpec*> tables = [] {
    std::vector<const RowTableSpec*> t;
#define KVSCOPE_ADD_TABLE(Row) t.push_back(&table_of<Row>());
    KVSCOPE_STEP_TABLES(KVSCOPE_ADD_TABLE)
#undef KVSCOPE_ADD_TABLE
    for (const RowTableSpec* spec : t) {
      KVSCOPE_CHECK(spec->rows_of != nullptr && spec->step_rows, spec->group + ": a step table");
      KVSCOPE_CHECK(!spec->columns.empty() && spec->columns[0].name == "step",
                    spec->group + ": a step table's first column is its step");
    }
    return t;
  }();
  return tables;
}

const std::vector<const RowTableSpec*>& row_tables() {
  static const std::vector<const RowTableSpec*> tables = [] {
    std::vector<const RowTableSpec*> t{&table_of<Event>(), &table_of<TierInterval>()};
    for (const RowTableSpec* s : step_tables()) t.push_back(s);
    return t;
  }();
  return tables;
}

std::string head_problem(int64_t layer, int64_t kv_head, int64_t L, int64_t K) {
  if (layer >= 0 && layer < L && kv_head >= 0 && kv_head < K) return {};
  return "layer/kv_head (" + std::to_string(layer) + ", " + std::to_string(kv_head) +
         ") outside " + std::to_string(L) + " x " + std::to_string(K);
}

int64_t int_value(const ColumnSpec& c, const void* row) {
  unsigned char e[8] = {};
  c.store(row, e);
  switch (c.elem) {
    case Elem::U8: return *reinterpret_cast<const uint8_t*>(e);
    case Elem::I8: return *reinterpret_cast<const int8_t*>(e);
    case Elem::U16: return *reinterpret_cast<const uint16_t*>(e);
    case Elem::I16: return *reinterpret_cast<const int16_t*>(e);
    case Elem::I32: return *reinterpret_cast<const int32_t*>(e);
    case Elem::I64: return *reinterpret_cast<const int64_t*>(e);
    default: KVSCOPE_CHECK(false, c.name + ": not an integer column");
  }
  return 0;
}

double float_value(const ColumnSpec& c, const void* row) {
  unsigned char e[8] = {};
  c.store(row, e);
  KVSCOPE_CHECK(c.elem == Elem::F32 || c.elem == Elem::F64, c.name + ": not a float column");
  return c.elem == Elem::F64 ? *reinterpret_cast<const double*>(e)
                             : double(*reinterpret_cast<const float*>(e));
}

std::string range_problem(const ColumnSpec& c, const void* row, const LimitSizes& sizes) {
  const Range& r = c.range;
  if (r.kind == Range::Kind::Any) return {};
  if (r.kind == Range::Kind::Float) {
    const double v = float_value(c, row);
    if (std::isnan(v) ? r.nan_ok : (v >= r.flo && v <= r.fhi)) return {};
    const std::string unit = c.units == "s" ? " s" : "";  // seconds print with their unit
    return "is " + number_text(v) + unit + " (expected " +
           (r.expect.empty() ? "finite, in [" + number_text(r.flo) + ", " + number_text(r.fhi) + "]"
                             : r.expect) +
           ")";
  }
  const int64_t v = int_value(c, row);
  const int64_t hi = sizes[r.limit] + r.offset;
  if ((v >= r.lo && v < hi) || v == r.also) return {};
  return "is " + std::to_string(v) + " (expected " +
         (r.expect.empty() ? std::to_string(r.lo) + " .. " + std::to_string(hi - 1) : r.expect) +
         ")";
}

}  // namespace kvscope::trace
// clang-format on
