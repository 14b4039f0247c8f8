// A minimal Parquet writer: one row group, PLAIN values, no compression,
// flat columns of UTF-8 text, int64 or double (the latter two nullable).
// Debian 12 packages no Parquet library for C++ (no Arrow), and a results
// table of a few thousand rows needs none of Parquet's encodings; pandas,
// pyarrow, polars and DuckDB read what this writes (tests/cli check it
// with pyarrow). Format: https://github.com/apache/parquet-format
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvscope::parquet {

struct Column {
  enum class Type { Text, Int64, Double };
  std::string name;
  Type type = Type::Text;
  std::vector<std::string> text;                 // Type::Text (never null)
  std::vector<std::optional<int64_t>> integers;  // Type::Int64
  std::vector<std::optional<double>> reals;      // Type::Double

  size_t size() const;
};

// Writes the columns (all of one length) to path atomically: a temporary
// file renamed into place. Throws std::runtime_error naming the file.
void write_table(const std::string& path, const std::vector<Column>& columns,
                 const std::string& created_by);

}  // namespace kvscope::parquet
