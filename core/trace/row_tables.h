// The trace's row tables, each declared once (row_tables.cpp): a group of 1-D
// columns that grow together, one row per record of a plain C++ type
// (types.h). From a declaration come the table's datasets in the schema, the
// writer's checks and appending, the validator's ranges and step order, the
// reader's rows and `kvscope info`'s counts. A new table of step rows is its
// row type and StepData field (types.h), its line in KVSCOPE_STEP_TABLES
// below and its entry in row_tables.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/trace/schema.h"
#include "core/trace/types.h"

namespace kvscope::trace {

// The tables whose rows belong to steps, by row type, in the schema's order.
// Events and tier intervals are row tables too, declared in the same file,
// but their rows are committed and indexed their own way.
#define KVSCOPE_STEP_TABLES(X) \
  X(StallRow) X(MergeRow) X(RerotationRow) X(ReconstructionRow) X(KeyChannelRow) X(InterventionRow)

// A size of the trace an integer column's values stay below.
enum class Limit : uint8_t {
  Constant,    // 0: the bound is the offset alone
  Steps,       // committed steps (the writer: the step being appended, + 1)
  Layers,      // L
  KvHeads,     // K
  Tokens,      // tokens fed (the writer: so far)
  MaxTokens,   // /run max_tokens
  Vocab,       // /run vocab_size
  HeadDim,     // /run head_dim
  Tiers,       // R
  Reasons,     // /run reason_names
  EventKinds,  // kEventKindCount
};

// The sizes a Limit names, for one trace (or the writer's state so far).
struct LimitSizes {
  int64_t size[11] = {};
  int64_t operator[](Limit l) const { return size[static_cast<int>(l)]; }
  int64_t& operator[](Limit l) { return size[static_cast<int>(l)]; }
};
LimitSizes limit_sizes(const RunInfo& run, const CaptureLayout& layout, int64_t steps,
                       int64_t tokens);

// What a column's values must be: integers lo <= v < size(limit) + offset (or
// v == also); floats lo <= v <= hi, NaN only when nan_ok. `expect` is the
// writer's wording of it ("" : made from the bounds).
struct Range {
  enum class Kind : uint8_t { Any, Int, Float } kind = Kind::Any;
  int64_t lo = 0;
  Limit limit = Limit::Constant;
  int64_t offset = 0;
  int64_t also = INT64_MIN;
  double flo = 0, fhi = 0;
  bool nan_ok = false;
  std::string expect;
};
Range int_range(int64_t lo, Limit limit, int64_t offset = 0, int64_t also = INT64_MIN,
                std::string expect = "");
Range float_range(double lo, double hi, bool nan_ok, std::string expect = "");

struct ColumnSpec {
  std::string name;  // dataset in the table's group
  Elem elem;
  std::string units;
  std::string meaning;
  Range range;
  double fill = 0;  // of elements never written
  // Moves the row's field into one element in memory (native order) and back.
  void (*store)(const void* row, void* element) = nullptr;
  void (*load)(const void* element, void* row) = nullptr;
};

// What a table's own checks are told about the writer's state.
struct RowContext {
  const RunInfo& run;
  const StepRecord& step;  // the step being appended
  int64_t tokens_fed;      // before this step
  size_t index;            // of the row among the step's rows
};
// A problem the writer refuses: the field (a dataset path) and what is wrong;
// field "" is none.
struct RowProblem {
  std::string field;
  std::string what;
};

struct RowTableSpec {
  std::string group;        // "/stalls"
  std::string meaning;      // of the group
  std::string noun;         // one row, in messages: "stall"
  std::string rows_symbol;  // the row axis in shapes and docs: "X"
  int64_t chunk = 4096;     // rows per chunk
  Feature feature = Feature::Always;
  int since_minor = 0;  // first minor version that holds the table
  // Rows name their step (column "step", first) in step order; a flush
  // writes them before it commits their steps.
  bool step_rows = true;
  size_t row_size = 0;  // sizeof the row type
  std::vector<ColumnSpec> columns;
  RowProblem (*check)(const void* row, const RowContext& context) = nullptr;  // beyond ranges
  // What a step's rows must be as a whole (e.g. only reconstruction steps have them).
  RowProblem (*check_step)(const StepData& step, const RowContext& context) = nullptr;
  // The rows a step carries (tables of KVSCOPE_STEP_TABLES).
  std::pair<const void*, size_t> (*rows_of)(const StepData& step) = nullptr;

  std::string path(const ColumnSpec& c) const { return group + "/" + c.name; }
  const ColumnSpec* column(const std::string& name) const;
};

// The declaration of the table of rows of type Row.
template <typename Row>
const RowTableSpec& table_of();
// The tables of KVSCOPE_STEP_TABLES, in order.
const std::vector<const RowTableSpec*>& step_tables();
// Every row table in the schema's order: events, tier intervals, step tables.
const std::vector<const RowTableSpec*>& row_tables();

// "" when (layer, kv_head) is a head of an L x K model, else the writer's words.
std::string head_problem(int64_t layer, int64_t kv_head, int64_t L, int64_t K);

// A row's value in an integer or a float column.
int64_t int_value(const ColumnSpec& c, const void* row);
double float_value(const ColumnSpec& c, const void* row);
// A value against a column's range, in the writer's words: "" when it holds.
std::string range_problem(const ColumnSpec& c, const void* row, const LimitSizes& sizes);

// ---- declaring columns (row_tables.cpp) ------------------------------------

template <typename T>
constexpr Elem elem_of() {
  if constexpr (std::is_enum_v<T>)
    return elem_of<std::underlying_type_t<T>>();
  else if constexpr (std::is_same_v<T, uint8_t>)
    return Elem::U8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return Elem::I8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return Elem::U16;
  else if constexpr (std::is_same_v<T, int16_t>)
    return Elem::I16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return Elem::I32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return Elem::I64;
  else if constexpr (std::is_same_v<T, float>)
    return Elem::F32;
  else {
    static_assert(std::is_same_v<T, double>, "no trace element type for this type");
    return Elem::F64;
  }
}

template <typename M>
struct MemberOf;
template <typename R, typename T>
struct MemberOf<T R::*> {
  using Row = R;
  using Type = T;
};

// The column of field `Member` (e.g. &StallRow::wait_s), its element type the field's.
template <auto Member>
ColumnSpec column(std::string name, std::string units, std::string meaning, Range range = {},
                  double fill = 0) {
  using Row = typename MemberOf<decltype(Member)>::Row;
  using T = typename MemberOf<decltype(Member)>::Type;
  ColumnSpec c{std::move(name),    elem_of<T>(),     std::move(units),
               std::move(meaning), std::move(range), fill};
  c.store = [](const void* row, void* element) {
    std::memcpy(element, &(static_cast<const Row*>(row)->*Member), sizeof(T));
  };
  c.load = [](const void* element, void* row) {
    std::memcpy(&(static_cast<Row*>(row)->*Member), element, sizeof(T));
  };
  return c;
}

}  // namespace kvscope::trace
