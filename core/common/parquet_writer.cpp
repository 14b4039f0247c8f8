#include "core/common/parquet_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/common/atomic_file.h"

namespace kvscope::parquet {

namespace {

// parquet.thrift's enum values.
enum PhysicalType : int32_t { kInt64 = 2, kDouble = 5, kByteArray = 6 };
enum Repetition : int32_t { kRequired = 0, kOptional = 1 };
enum Encoding : int32_t { kPlain = 0, kRle = 3 };
constexpr int32_t kConvertedUtf8 = 0;
constexpr int32_t kUncompressed = 0;
constexpr int32_t kDataPage = 0;

// Thrift's compact protocol, only what the footer and page headers use.
class Compact {
 public:
  enum Type : uint8_t { kI32 = 5, kI64 = 6, kBinary = 8, kList = 9, kStruct = 12 };

  void i32(int16_t id, int32_t v) { header(id, kI32), varint(zigzag(v)); }
  void i64(int16_t id, int64_t v) { header(id, kI64), varint(zigzag(v)); }
  void binary(int16_t id, const std::string& s) { header(id, kBinary), raw_binary(s); }
  void begin_struct(int16_t id) {
    header(id, kStruct);
    last_.push_back(0);
  }
  void begin_list(int16_t id, Type element, size_t n) {
    header(id, kList);
    list_header(element, n);
  }
  // A struct that is an element of a list.
  void begin_element() { last_.push_back(0); }
  void end_struct() {
    out_.push_back(0);  // stop field
    last_.pop_back();
  }
  void list_i32(int32_t v) { varint(zigzag(v)); }
  void raw_binary(const std::string& s) {
    varint(s.size());
    out_ += s;
  }
  std::string& bytes() { return out_; }

 private:
  static uint64_t zigzag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(char(uint8_t(v) | 0x80));
      v >>= 7;
    }
    out_.push_back(char(v));
  }
  void header(int16_t id, uint8_t type) {
    const int16_t delta = int16_t(id - last_.back());
    if (delta > 0 && delta <= 15) {
      out_.push_back(char((delta << 4) | type));
    } else {
      out_.push_back(char(type));
      varint(zigzag(id));
    }
    last_.back() = id;
  }
  void list_header(Type element, size_t n) {
    if (n < 15)
      out_.push_back(char((n << 4) | element));
    else
      out_.push_back(char(0xF0 | element)), varint(n);
  }

  std::string out_;
  std::vector<int16_t> last_{0};  // last field id per open struct
};

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}

bool nullable(const Column& c) {
  return c.type != Column::Type::Text;
}

// Definition levels (1 = present) in the RLE/bit-packed hybrid, bit width 1:
// runs of equal levels, each a varint header (run length << 1) and one byte.
std::string definition_levels(const std::vector<bool>& present) {
  std::string rle;
  for (size_t i = 0; i < present.size();) {
    size_t j = i;
    while (j < present.size() && present[j] == present[i]) ++j;
    uint64_t header = uint64_t(j - i) << 1;
    while (header >= 0x80) rle.push_back(char(uint8_t(header) | 0x80)), header >>= 7;
    rle.push_back(char(header));
    rle.push_back(char(present[i] ? 1 : 0));
    i = j;
  }
  std::string out;
  put_le(out, rle.size(), 4);
  return out + rle;
}

// The data page body: definition levels (nullable columns) then PLAIN values.
std::string page_body(const Column& c) {
  std::string values;
  std::vector<bool> present;
  switch (c.type) {
    case Column::Type::Text:
      for (const std::string& s : c.text) put_le(values, s.size(), 4), values += s;
      break;
    case Column::Type::Int64:
      for (const auto& v : c.integers) {
        present.push_back(v.has_value());
        if (v) put_le(values, uint64_t(*v), 8);
      }
      break;
    case Column::Type::Double:
      for (const auto& v : c.reals) {
        present.push_back(v.has_value());
        if (!v) continue;
        uint64_t bits;
        std::memcpy(&bits, &*v, sizeof bits);
        put_le(values, bits, 8);
      }
      break;
  }
  return (nullable(c) ? definition_levels(present) : std::string()) + values;
}

std::string page_header(const Column& c, size_t body_size) {
  Compact t;
  t.i32(1, kDataPage);
  t.i32(2, int32_t(body_size));
  t.i32(3, int32_t(body_size));
  t.begin_struct(5);  // DataPageHeader
  t.i32(1, int32_t(c.size()));
  t.i32(2, kPlain);
  t.i32(3, kRle);
  t.i32(4, kRle);
  t.end_struct();
  t.bytes().push_back(0);  // end of PageHeader
  return t.bytes();
}

int32_t physical_type(const Column& c) {
  switch (c.type) {
    case Column::Type::Text: return kByteArray;
    case Column::Type::Int64: return kInt64;
    case Column::Type::Double: return kDouble;
  }
  return kByteArray;
}

struct ChunkInfo {
  int64_t offset = 0, size = 0;
};

std::string footer(const std::vector<Column>& columns, const std::vector<ChunkInfo>& chunks,
                   const std::string& created_by) {
  const int64_t rows = columns.empty() ? 0 : int64_t(columns[0].size());
  Compact t;
  t.i32(1, 1);  // version
  t.begin_list(2, Compact::kStruct, columns.size() + 1);
  t.begin_element();  // the root
  t.binary(4, "schema");
  t.i32(5, int32_t(columns.size()));
  t.end_struct();
  for (const Column& c : columns) {
    t.begin_element();
    t.i32(1, physical_type(c));
    t.i32(3, nullable(c) ? kOptional : kRequired);
    t.binary(4, c.name);
    if (c.type == Column::Type::Text) {
      t.i32(6, kConvertedUtf8);
      t.begin_struct(10);  // LogicalType, the STRING member (an empty struct)
      t.begin_struct(1);
      t.end_struct();
      t.end_struct();
    }
    t.end_struct();
  }
  t.i64(3, rows);
  t.begin_list(4, Compact::kStruct, 1);  // one row group
  t.begin_element();
  t.begin_list(1, Compact::kStruct, columns.size());
  int64_t total = 0;
  for (size_t i = 0; i < columns.size(); ++i) {
    const Column& c = columns[i];
    total += chunks[i].size;
    t.begin_element();  // ColumnChunk
    t.i64(2, chunks[i].offset);
    t.begin_struct(3);  // ColumnMetaData
    t.i32(1, physical_type(c));
    t.begin_list(2, Compact::kI32, nullable(c) ? 2 : 1);
    t.list_i32(kPlain);
    if (nullable(c)) t.list_i32(kRle);
    t.begin_list(3, Compact::kBinary, 1);
    t.raw_binary(c.name);
    t.i32(4, kUncompressed);
    t.i64(5, int64_t(c.size()));
    t.i64(6, chunks[i].size);
    t.i64(7, chunks[i].size);
    t.i64(9, chunks[i].offset);
    t.end_struct();
    t.end_struct();
  }
  t.i64(2, total);
  t.i64(3, rows);
  t.end_struct();
  t.binary(6, created_by);
  t.bytes().push_back(0);  // end of FileMetaData
  return t.bytes();
}

}  // namespace

size_t Column::size() const {
  switch (type) {
    case Type::Text: return text.size();
    case Type::Int64: return integers.size();
    case Type::Double: return reals.size();
  }
  return 0;
}

void write_table(const std::string& path, const std::vector<Column>& columns,
                 const std::string& created_by) {
  for (const Column& c : columns)
    if (c.size() != columns[0].size())
      throw std::runtime_error(path + ": column '" + c.name + "' has " + std::to_string(c.size()) +
                               " values, expected " + std::to_string(columns[0].size()));
  std::string file = "PAR1";
  std::vector<ChunkInfo> chunks;
  for (const Column& c : columns) {
    const std::string body = page_body(c);
    const std::string header = page_header(c, body.size());
    chunks.push_back({int64_t(file.size()), int64_t(header.size() + body.size())});
    file += header + body;
  }
  const std::string meta = footer(columns, chunks, created_by);
  file += meta;
  put_le(file, meta.size(), 4);
  file += "PAR1";
  write_file_atomically(path, file, "the Parquet file");
}

}  // namespace kvscope::parquet
