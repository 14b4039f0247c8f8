// The catalogue of damaged files (docs/trace-format.md, "Errors"): each gives
// its exact error from the reader and from the validator, never a crash or an
// unbounded allocation.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <fstream>

#include "core/trace/error.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "tests/core/trace_edit.h"
#include "tests/core/trace_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using namespace kvscope::trace;
using kvscope::test::Edit;

namespace {

struct Damaged {
  std::string path;
  ErrorCode reader_code;
  std::string field;    // the field the error names
  std::string message;  // the exact message (after "file: field: ")
};

std::string fresh_copy(const std::string& dir, const std::string& name) {
  static std::string original;
  static std::string original_dir;
  if (original.empty()) {
    original_dir = test::temp_dir();
    original = test::write_small_trace(original_dir, "original.kvtrace.h5", 2, 5);
  }
  std::string path = dir + "/" + name;
  test::copy_file(original, path);
  return path;
}

void expect_reader_error(const Damaged& d) {
  try {
    auto r = TraceReader::open(d.path);
    FAIL("opened a damaged file: " << d.path);
  } catch (const TraceError& e) {
    CHECK(e.code() == d.reader_code);
    CHECK(e.field() == d.field);
    CHECK(std::string(e.what()) ==
          d.path + (d.field.empty() ? "" : ": " + d.field) + ": " + d.message);
  }
}

void expect_violation(const std::string& path, const std::string& field,
                      const std::string& message) {
  ValidationReport report = validate_trace(path);
  bool found = false;
  for (const auto& v : report.violations) {
    UNSCOPED_INFO(v.field << ": " << v.message);
    if (v.field == field && v.message == message) found = true;
  }
  CHECK_FALSE(report.ok());
  CHECK(found);
}

}  // namespace

TEST_CASE("files that are not traces at all", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  SECTION("missing file") {
    Damaged d{dir + "/nope.h5", ErrorCode::Io, "", "cannot open: No such file or directory"};
    expect_reader_error(d);
    expect_violation(d.path, "/", d.message);
  }
  SECTION("empty file") {
    std::ofstream(dir + "/empty.h5").close();
    Damaged d{dir + "/empty.h5", ErrorCode::NotATrace, "", "empty file, not a KVScope trace"};
    expect_reader_error(d);
  }
  SECTION("not HDF5") {
    std::ofstream(dir + "/text.h5") << "this is a text file, not a trace\n";
    Damaged d{dir + "/text.h5", ErrorCode::NotATrace, "",
              "not an HDF5 file (no HDF5 signature), so not a KVScope trace"};
    expect_reader_error(d);
    expect_violation(d.path, "/", d.message);
  }
  SECTION("HDF5 without the format attribute") {
    std::string path = dir + "/plain.h5";
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    Damaged d{
        path, ErrorCode::NotATrace, "/ attribute format",
        "missing; this HDF5 file is not a KVScope trace (expected format = \"kvscope-trace\")"};
    expect_reader_error(d);
    expect_violation(path, d.field, d.message);
  }
}

TEST_CASE("truncated trace", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  std::string path = fresh_copy(dir, "truncated.h5");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size() / 2));
  try {
    TraceReader::open(path);
    FAIL("opened a truncated file");
  } catch (const TraceError& e) {
    CHECK(e.code() == ErrorCode::Io);
    CHECK_THAT(e.what(), Catch::StartsWith(path + ": HDF5 file is damaged or truncated: "));
  }
  CHECK_FALSE(validate_trace(path).ok());
}

TEST_CASE("wrong format name and versions", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  SECTION("another format") {
    std::string p = fresh_copy(dir, "other.h5");
    Edit(p).set_string_attr("/", "format", "netcdf-thing");
    Damaged d{p, ErrorCode::NotATrace, "/ attribute format",
              "is \"netcdf-thing\"; not a KVScope trace (expected \"kvscope-trace\")"};
    expect_reader_error(d);
    expect_violation(p, d.field, d.message);
  }
  SECTION("too new") {
    std::string p = fresh_copy(dir, "new.h5");
    Edit(p).set_i64_attr("/", "version", 2);
    Damaged d{
        p, ErrorCode::TooNew, "/ attribute version",
        "trace format version 2 is too new: this KVScope reads versions 1 to 1; upgrade KVScope"};
    expect_reader_error(d);
    expect_violation(p, d.field, d.message);
  }
  SECTION("too old") {
    std::string p = fresh_copy(dir, "old.h5");
    Edit(p).set_i64_attr("/", "version", 0);
    Damaged d{
        p, ErrorCode::TooOld, "/ attribute version",
        "trace format version 0 is too old: this KVScope reads versions 1 to 1; re-capture or "
        "convert it"};
    expect_reader_error(d);
  }
}

TEST_CASE("absurd sizes are refused before anything is allocated", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  SECTION("a billion layers") {
    std::string p = fresh_copy(dir, "layers.h5");
    Edit(p).set_i64_attr("/run", "n_layers", 1000000000);
    Damaged d{p, ErrorCode::TooLarge, "/run attribute n_layers",
              "is 1000000000 (expected 1..4096)"};
    expect_reader_error(d);
    expect_violation(p, d.field, d.message);
  }
  SECTION("token capacity beyond the limit") {
    std::string p = fresh_copy(dir, "tokens.h5");
    Edit(p).set_i64_attr("/run", "max_tokens", int64_t(1) << 40);
    Damaged d{p, ErrorCode::TooLarge, "/run attribute max_tokens",
              "is 1099511627776 (expected 1..67108864)"};
    expect_reader_error(d);
  }
  SECTION("kv heads that do not divide the heads") {
    std::string p = fresh_copy(dir, "gqa.h5");
    Edit(p).set_i64_attr("/run", "n_kv_heads", 3);
    Damaged d{p, ErrorCode::Schema, "/run attribute n_kv_heads",
              "is 3 (expected a divisor of n_heads = 4)"};
    expect_reader_error(d);
  }
  SECTION("a pooled block of 2^40 tokens") {
    std::string p = fresh_copy(dir, "pooled.h5");
    Edit(p).set_i64_attr("/attention/pooled", "block", int64_t(1) << 40);
    Damaged d{p, ErrorCode::TooLarge, "/attention/pooled attribute block",
              "is 1099511627776 (expected 1..67108864)"};
    expect_reader_error(d);
  }
}

TEST_CASE("missing, mistyped and mis-shaped datasets", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  SECTION("missing dataset") {
    std::string p = fresh_copy(dir, "missing.h5");
    Edit(p).remove("/events/kind");
    Damaged d{p, ErrorCode::Schema, "/events/kind", "dataset missing"};
    expect_reader_error(d);
    expect_violation(p, "/events/kind", "dataset missing");
  }
  SECTION("missing attribute") {
    std::string p = fresh_copy(dir, "noattr.h5");
    {
      Edit e(p);
      hid_t run = H5Oopen(e.file, "/run", H5P_DEFAULT);
      REQUIRE(H5Adelete(run, "policy") >= 0);
      H5Oclose(run);
    }
    Damaged d{p, ErrorCode::Schema, "/run attribute policy", "missing (expected a string)"};
    expect_reader_error(d);
    expect_violation(p, d.field, d.message);
  }
  SECTION("mistyped dataset") {
    std::string p = fresh_copy(dir, "mistyped.h5");
    Edit(p).retype_to_float("/tokens/id");
    Damaged d{p, ErrorCode::Schema, "/tokens/id", "element type is float32 (expected int32)"};
    expect_reader_error(d);
    expect_violation(p, d.field, d.message);
  }
  SECTION("shapes that disagree") {
    std::string p = fresh_copy(dir, "shape.h5");
    int64_t tokens = TraceReader::open(p)->n_tokens();
    Edit(p).extend("/tokens/role", 5);
    expect_violation(p, "/tokens/role",
                     "axis 0 (T) has length " + std::to_string(tokens + 5) + " (expected " +
                         std::to_string(tokens) + ")");
  }
  SECTION("a step referring past the end of /events") {
    std::string p = fresh_copy(dir, "events.h5");
    int64_t steps = TraceReader::open(p)->n_steps();
    Edit(p).write_i64("/steps/event_count", hsize_t(steps - 1), 1 << 20);
    Damaged d{p, ErrorCode::Schema, "/steps",
              "the last step refers to tokens or events beyond the end of /tokens or /events"};
    expect_reader_error(d);
  }
}

TEST_CASE("values out of range are listed by dataset path", "[trace][corrupt]") {
  std::string dir = test::temp_dir();
  std::string p = fresh_copy(dir, "values.h5");
  {
    Edit e(p);
    e.write_i64("/events/layer", 17, 99);
    e.write_i64("/events/kind", 3, 42);
    e.write_i64("/steps/entries", 2, -5);
    e.write_i64("/tokens/role", 0, 200);
  }
  expect_violation(p, "/events/layer", "1 value(s) outside [0, 3); first at row 17 = 99");
  expect_violation(p, "/events/kind", "1 value(s) outside [0, 6); first at row 3 = 42");
  expect_violation(p, "/tokens/role", "1 value(s) outside [0, 5); first at row 0 = 200");
  expect_violation(
      p, "/steps/entries",
      "1 step(s) whose entries differ from the sum of /occupancy/entries; first at step 2");
  expect_violation(p, "/steps/entries", "1 value(s) outside [0, +inf); first at row 2 = -5");
  ValidationReport report = validate_trace(p);
  CHECK(report.violations.size() == 5);
}

namespace {

// One element of an integer dataset of any rank, by coordinate (the last
// along axis 0 when `last` is set), written with the raw HDF5 API.
void write_element(const std::string& path, const char* dataset, std::vector<hsize_t> coord,
                   int64_t value, bool last = false) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  hid_t d = H5Dopen2(file, dataset, H5P_DEFAULT);
  hid_t fs = H5Dget_space(d);
  std::vector<hsize_t> dims(coord.size());
  REQUIRE(H5Sget_simple_extent_dims(fs, dims.data(), nullptr) == int(coord.size()));
  if (last) coord[0] = dims[0] - 1;
  H5Sselect_elements(fs, H5S_SELECT_SET, 1, coord.data());
  hid_t ms = H5Screate(H5S_SCALAR);
  REQUIRE(H5Dwrite(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &value) >= 0);
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  H5Fclose(file);
}

bool has_violation(const std::string& path, const std::string& field) {
  for (const Violation& v : validate_trace(path).violations)
    if (v.field == field) return true;
  return false;
}

}  // namespace

// Fuzzing findings (tests/fuzz/regressions/trace_read, trace_validate): values
// whose sums overflow int64 (UBSan: signed integer overflow) and a dataset of
// rank 0 where the reader indexed axis 0 of its extent (out of bounds).
TEST_CASE("overflowing offsets and datasets of the wrong rank are errors, not crashes",
          "[trace][corrupt]") {
  const std::string dir = test::temp_dir();
  {
    const std::string p = fresh_copy(dir, "text_begin.kvtrace.h5");
    write_element(p, "/tokens/text_begin", {0}, INT64_MAX);
    auto r = TraceReader::open(p);
    CHECK_THROWS_WITH(r->tokens(0, 1),
                      Catch::Contains("/tokens/text_begin") && Catch::Contains("overflowing"));
    CHECK(has_violation(p, "/tokens/text_begin"));
  }
  {
    const std::string p = fresh_copy(dir, "event_begin.kvtrace.h5");
    write_element(p, "/steps/event_begin", {0}, INT64_MAX, /*last=*/true);
    CHECK_THROWS_WITH(TraceReader::open(p), Catch::Contains("/steps"));
    CHECK(has_violation(p, "/steps/event_begin"));
  }
  {
    const std::string p = fresh_copy(dir, "received.kvtrace.h5");
    write_element(p, "/attention/received/offset", {0, 0, 0}, INT64_MAX);
    write_element(p, "/attention/received/count", {0, 0, 0}, 5);
    auto r = TraceReader::open(p);
    CHECK_THROWS_WITH(r->received(0, 0, 0), Catch::Contains("/attention/received/offset"));
    CHECK(has_violation(p, "/attention/received/offset"));
  }
  {
    const std::string p = fresh_copy(dir, "text_bytes.kvtrace.h5");
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t file = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(H5Ldelete(file, "/generation/text_bytes", H5P_DEFAULT) >= 0);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(file, "/generation/text_bytes", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT);
    REQUIRE(d >= 0);
    H5Dclose(d);
    H5Sclose(s);
    H5Fclose(file);
    auto r = TraceReader::open(p);
    CHECK_THROWS_WITH(r->generated_text(), Catch::Contains("/generation/text_bytes: has rank 0 "
                                                           "(expected 1)"));
    CHECK(has_violation(p, "/generation/text_bytes"));
  }
}
