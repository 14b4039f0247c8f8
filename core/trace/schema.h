// The trace format v1 as data: every dataset's path, element type, axes,
// chunking, units and meaning. The writer creates datasets from this table,
// the validator checks files against it and `kvscope info --schema` prints
// it, so docs/trace-format.md, the writer and the checker cannot drift apart.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/trace/types.h"

namespace kvscope::trace {

enum class Elem : uint8_t { U8, I8, U16, I16, I32, I64, F16, F32, F64 };

// Symbolic axis lengths. Growth axes follow the capture; fixed axes come from
// /run attributes and the capture layout.
enum class Axis : uint8_t {
  Steps,        // S: forward steps (rows of /steps)
  Tokens,       // T: tokens fed to the model (rows of /tokens)
  TextBytes,    // bytes of all token pieces
  ReceivedRows,  // N: (token, mass) pairs of /attention/received
  QueryBlocks,  // ceil(T / pooled_block)
  GateSamples,  // rows of /gates/<name>/samples
  GenBytes,     // bytes of generated text
  Layers,       // L
  Heads,        // H: query heads
  KvHeads,      // K: key/value heads
  Tiers,        // R: memory tiers (/run tier_names)
  HeadSlots1,   // L * K + 1
  KeyBlocks,    // ceil(max_tokens / pooled_block)
  DenseHeads,   // D: heads with dense rows
  Two,          // 2
  KeyTokens,    // max_tokens
  TopK,         // k of /attention/topk
  TableRows,    // rows of the dataset's row table (row_tables.h: E, I, X, Y, Z, C, P)
};
inline constexpr int kAxisCount = 18;
const char* axis_symbol(Axis axis);
bool axis_grows(Axis axis);

enum class Feature : uint8_t {
  Always,
  Tiered,
  Received,
  Pooled,
  Dense,
  TopK,
  Oracle,
  Gate,
  Series
};
const char* feature_name(Feature feature);

struct DatasetSpec {
  std::string path;  // may contain "{gate}" or "{series}", replaced per gate or series
  Elem elem;
  std::vector<Axis> dims;      // empty: scalar dataset
  int append_axis;             // axis that grows during capture; -1: fixed shape
  std::vector<int64_t> chunk;  // per axis: >0 fixed, 0 full extent, -1 fill to ~256 KiB
  std::string units;
  std::string meaning;
  Feature feature;
  double fill = 0;  // fill value of unwritten elements
  // Deflate + shuffle. Off for datasets rewritten in place during a capture:
  // while SWMR-writing, HDF5 cannot reuse the file space of a rewritten
  // compressed chunk, so rewrites would grow the file without bound.
  bool compress = true;
  // First minor version that holds the dataset: older traces lack it and
  // are not asked for it (3 for /stalls).
  int since_minor = 0;
  // Columns of a row table (row_tables.h): its group and its row axis's
  // symbol; empty for other datasets.
  std::string table = {};
  std::string rows_symbol = {};
};

// The symbol of axis i of a dataset ("S", "L*K+1", a table's "X").
std::string axis_label(const DatasetSpec& spec, size_t i);

// The whole catalogue with "{gate}" and "{series}" placeholders.
const std::vector<DatasetSpec>& dataset_catalogue();

// The datasets a trace of this minor version with this layout holds (gates
// and series expanded, optional groups and those newer than the trace
// filtered).
std::vector<DatasetSpec> datasets_for(const CaptureLayout& layout, int64_t n_tiers,
                                      int64_t minor_version = kFormatMinorVersion);

// Groups and their meaning (for attributes and documentation).
struct GroupSpec {
  std::string path;
  std::string meaning;
  int since_minor = 0;  // first minor version that holds the group
};
const std::vector<GroupSpec>& group_catalogue();

// Root and /run attributes a reader requires.
struct AttributeSpec {
  std::string object;  // "/" or "/run"
  std::string name;
  std::string type;  // "string", "int64", "float64", "string[]"
  std::string meaning;
};
const std::vector<AttributeSpec>& attribute_catalogue();

// Sizes of the axes of one trace; a row table's rows by its group.
struct AxisSizes {
  int64_t size[kAxisCount] = {};
  std::map<std::string, int64_t> table_rows;
  int64_t& operator[](Axis a) { return size[static_cast<int>(a)]; }
  int64_t operator[](Axis a) const { return size[static_cast<int>(a)]; }
  // The length of axis i of a dataset.
  int64_t of(const DatasetSpec& spec, size_t i) const;
};

// Fixed axes from the run and layout; growth axes zero.
AxisSizes fixed_axis_sizes(const ModelInfo& model, const CaptureLayout& layout, int64_t n_tiers);

// The schema as Markdown tables (for docs/trace-format.md and `info --schema`).
std::string schema_markdown();

}  // namespace kvscope::trace
