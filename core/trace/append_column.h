// The writer's growing columns: rows appended along axis 0 of one dataset,
// buffered until a flush writes them after the rows already on disk; and a
// row table's columns (row_tables.h) resolved once. Internal to core/trace.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/trace/h5.h"
#include "core/trace/row_tables.h"

namespace kvscope::trace {

struct AppendColumn {
  h5::Handle dset;
  std::string path;
  Elem elem = Elem::U8;
  size_t row_elems = 1;  // elements per row (product of the other axes)
  hsize_t rows_on_disk = 0;
  std::vector<uint8_t> pending;

  size_t pending_rows() const { return pending.size() / (row_elems * h5::elem_size(elem)); }

  template <typename T>
  void push(const T* data, size_t n_rows) {
    static_assert(std::is_arithmetic<T>::value, "plain numbers only");
    size_t bytes = n_rows * row_elems * sizeof(T);
    size_t at = pending.size();
    pending.resize(at + bytes);
    if (bytes) std::memcpy(pending.data() + at, data, bytes);
  }
  template <typename T>
  void push1(T value) {
    push(&value, 1);
  }
  // One element of this column's type, in memory.
  void push_element(const void* element) {
    const size_t bytes = h5::elem_size(elem);
    pending.insert(pending.end(), static_cast<const uint8_t*>(element),
                   static_cast<const uint8_t*>(element) + bytes);
  }
  // Extends the dataset by the pending rows and writes them; throws
  // TraceError(Io) naming `trace_path` and the dataset.
  void write(const std::string& trace_path);
};

// A row table's columns, resolved once (events are the hot path of a
// capture), and the columns the writer checks by name.
struct TableColumns {
  const RowTableSpec* spec = nullptr;
  std::vector<AppendColumn*> columns;  // in the declaration's order
  const ColumnSpec *step = nullptr, *layer = nullptr, *kv_head = nullptr, *token = nullptr;

  // Appends one row of the table's row type to every column.
  void push(const void* row) const;
};

}  // namespace kvscope::trace
