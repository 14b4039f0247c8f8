// Thin RAII layer over the HDF5 C API, used only inside core/trace. Nothing
// outside core/trace includes this header: views and tools go through
// TraceReader.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/trace/schema.h"

namespace kvscope::trace::h5 {

// Owns one hid_t and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  explicit operator bool() const { return valid(); }
  void reset();

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

Handle file(hid_t id);
Handle group(hid_t id);
Handle dataset(hid_t id);
Handle dataspace(hid_t id);
Handle datatype(hid_t id);
Handle attribute(hid_t id);
Handle plist(hid_t id);

// Turns off HDF5's printing of error stacks (once per process); errors are
// reported through TraceError with the innermost HDF5 message instead.
void silence_library_errors();
// The most specific message on the current HDF5 error stack, then clears it.
std::string take_error_message();

// Native memory type and little-endian file type of an element kind.
hid_t memory_type(Elem elem);
hid_t file_type(Elem elem);  // caller must not close; F16 is a shared custom type
size_t elem_size(Elem elem);
const char* elem_name(Elem elem);
// The Elem an HDF5 type is, or false when it is none of ours.
bool classify_type(hid_t type, Elem* elem);

bool link_exists(hid_t loc, const std::string& path);

// Attribute helpers. Strings are variable-length UTF-8.
void write_attr_string(hid_t obj, const char* name, const std::string& value);
void write_attr_strings(hid_t obj, const char* name, const std::vector<std::string>& values);
void write_attr_i64(hid_t obj, const char* name, int64_t value);
void write_attr_f64(hid_t obj, const char* name, double value);
// A 1-D uint8 attribute (e.g. /run tier_attended).
void write_attr_u8s(hid_t obj, const char* name, const std::vector<uint8_t>& values);
// A 1-D int64 attribute (e.g. /run layer_window).
void write_attr_i64s(hid_t obj, const char* name, const std::vector<int64_t>& values);
// String readers: false when the attribute is missing, not a string (or
// too many), or unreadable, with the reason in words in *why when given.
bool read_attr_string(hid_t obj, const char* name, std::string* out, std::string* why = nullptr);
bool read_attr_strings(hid_t obj, const char* name, std::vector<std::string>* out, size_t max_count,
                       std::string* why = nullptr);
bool read_attr_i64(hid_t obj, const char* name, int64_t* out);
bool read_attr_f64(hid_t obj, const char* name, double* out);
// A scalar or 1-D integer attribute of at most max_count values, converted to
// int64: false when it is missing, not integers, too long or unreadable, with
// the reason in words in *why when given.
bool read_attr_ints(hid_t obj, const char* name, std::vector<int64_t>* out, size_t max_count,
                    std::string* why = nullptr);

// Current extent of a dataset.
std::vector<hsize_t> extent(hid_t dset);

}  // namespace kvscope::trace::h5
