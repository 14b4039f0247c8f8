#include "core/trace/h5.h"

#include <mutex>

namespace kvscope::trace::h5 {

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    closer_ = other.closer_;
    other.id_ = -1;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = -1;
}

Handle file(hid_t id) {
  return Handle(id, H5Fclose);
}
Handle group(hid_t id) {
  return Handle(id, H5Gclose);
}
Handle dataset(hid_t id) {
  return Handle(id, H5Dclose);
}
Handle dataspace(hid_t id) {
  return Handle(id, H5Sclose);
}
Handle datatype(hid_t id) {
  return Handle(id, H5Tclose);
}
Handle attribute(hid_t id) {
  return Handle(id, H5Aclose);
}
Handle plist(hid_t id) {
  return Handle(id, H5Pclose);
}

void silence_library_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

namespace {
herr_t innermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;  // n == 0 is where the error arose
  return 0;
}
}  // namespace

std::string take_error_message() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &message);
  H5Eclear2(H5E_DEFAULT);
  return message.empty() ? std::string("HDF5 error") : message;
}

namespace {
// IEEE binary16, little-endian. HDF5 1.10 has no predefined half type; h5py
// reads this layout as numpy float16.
hid_t half_type() {
  static hid_t type = [] {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    H5Tlock(t);
    return t;
  }();
  return type;
}
}  // namespace

hid_t memory_type(Elem elem) {
  switch (elem) {
    case Elem::U8:
      return H5T_NATIVE_UINT8;
    case Elem::I8:
      return H5T_NATIVE_INT8;
    case Elem::U16:
      return H5T_NATIVE_UINT16;
    case Elem::I16:
      return H5T_NATIVE_INT16;
    case Elem::I32:
      return H5T_NATIVE_INT32;
    case Elem::I64:
      return H5T_NATIVE_INT64;
    case Elem::F16:
      return half_type();  // written and read as raw binary16 bits
    case Elem::F32:
      return H5T_NATIVE_FLOAT;
    case Elem::F64:
      return H5T_NATIVE_DOUBLE;
  }
  return -1;
}

hid_t file_type(Elem elem) {
  switch (elem) {
    case Elem::U8:
      return H5T_STD_U8LE;
    case Elem::I8:
      return H5T_STD_I8LE;
    case Elem::U16:
      return H5T_STD_U16LE;
    case Elem::I16:
      return H5T_STD_I16LE;
    case Elem::I32:
      return H5T_STD_I32LE;
    case Elem::I64:
      return H5T_STD_I64LE;
    case Elem::F16:
      return half_type();
    case Elem::F32:
      return H5T_IEEE_F32LE;
    case Elem::F64:
      return H5T_IEEE_F64LE;
  }
  return -1;
}

size_t elem_size(Elem elem) {
  switch (elem) {
    case Elem::U8:
    case Elem::I8:
      return 1;
    case Elem::U16:
    case Elem::I16:
    case Elem::F16:
      return 2;
    case Elem::I32:
    case Elem::F32:
      return 4;
    case Elem::I64:
    case Elem::F64:
      return 8;
  }
  return 0;
}

const char* elem_name(Elem elem) {
  switch (elem) {
    case Elem::U8:
      return "uint8";
    case Elem::I8:
      return "int8";
    case Elem::U16:
      return "uint16";
    case Elem::I16:
      return "int16";
    case Elem::I32:
      return "int32";
    case Elem::I64:
      return "int64";
    case Elem::F16:
      return "float16";
    case Elem::F32:
      return "float32";
    case Elem::F64:
      return "float64";
  }
  return "?";
}

bool classify_type(hid_t type, Elem* elem) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) {
    bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1:
        *elem = is_signed ? Elem::I8 : Elem::U8;
        return true;
      case 2:
        if (!is_signed) {
          *elem = Elem::U16;
          return true;
        }
        *elem = Elem::I16;
        return true;
      case 4:
        if (!is_signed) return false;
        *elem = Elem::I32;
        return true;
      case 8:
        if (!is_signed) return false;
        *elem = Elem::I64;
        return true;
      default:
        return false;
    }
  }
  if (cls == H5T_FLOAT) {
    switch (size) {
      case 2:
        *elem = Elem::F16;
        return true;
      case 4:
        *elem = Elem::F32;
        return true;
      case 8:
        *elem = Elem::F64;
        return true;
      default:
        return false;
    }
  }
  return false;
}

bool link_exists(hid_t loc, const std::string& path) {
  // Walk component by component: H5Lexists fails on a missing intermediate.
  size_t pos = 0;
  while (true) {
    size_t next = path.find('/', pos + 1);
    std::string prefix = path.substr(0, next);
    if (!prefix.empty() && prefix != "/") {
      htri_t exists = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
      if (exists <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
    }
    if (next == std::string::npos) return true;
    pos = next;
  }
}

namespace {
Handle vlen_string_type() {
  Handle t = datatype(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

Handle make_attr(hid_t obj, const char* name, hid_t type, hid_t space) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  return attribute(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT));
}
}  // namespace

void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  Handle type = vlen_string_type();
  Handle space = dataspace(H5Screate(H5S_SCALAR));
  Handle attr = make_attr(obj, name, type.get(), space.get());
  const char* data = value.c_str();
  H5Awrite(attr.get(), type.get(), &data);
}

void write_attr_strings(hid_t obj, const char* name, const std::vector<std::string>& values) {
  Handle type = vlen_string_type();
  hsize_t n = values.size();
  Handle space = dataspace(H5Screate_simple(1, &n, nullptr));
  Handle attr = make_attr(obj, name, type.get(), space.get());
  std::vector<const char*> data;
  for (const std::string& v : values) data.push_back(v.c_str());
  if (n > 0) H5Awrite(attr.get(), type.get(), data.data());
}

void write_attr_i64(hid_t obj, const char* name, int64_t value) {
  Handle space = dataspace(H5Screate(H5S_SCALAR));
  Handle attr = make_attr(obj, name, H5T_STD_I64LE, space.get());
  H5Awrite(attr.get(), H5T_NATIVE_INT64, &value);
}

void write_attr_f64(hid_t obj, const char* name, double value) {
  Handle space = dataspace(H5Screate(H5S_SCALAR));
  Handle attr = make_attr(obj, name, H5T_IEEE_F64LE, space.get());
  H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value);
}

void write_attr_u8s(hid_t obj, const char* name, const std::vector<uint8_t>& values) {
  hsize_t n = values.size();
  Handle space = dataspace(H5Screate_simple(1, &n, nullptr));
  Handle attr = make_attr(obj, name, H5T_STD_U8LE, space.get());
  if (n > 0) H5Awrite(attr.get(), H5T_NATIVE_UINT8, values.data());
}

void write_attr_i64s(hid_t obj, const char* name, const std::vector<int64_t>& values) {
  hsize_t n = values.size();
  Handle space = dataspace(H5Screate_simple(1, &n, nullptr));
  Handle attr = make_attr(obj, name, H5T_STD_I64LE, space.get());
  if (n > 0) H5Awrite(attr.get(), H5T_NATIVE_INT64, values.data());
}

namespace {
// Opens an attribute and checks it is a string (scalar or 1-D with at most
// max_count elements). Returns the element count, or -1 with *why set.
int64_t open_string_attr(hid_t obj, const char* name, size_t max_count, Handle* attr, Handle* space,
                         Handle* type, std::string* why) {
  if (H5Aexists(obj, name) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    *why = "missing (expected a string)";
    return -1;
  }
  *attr = attribute(H5Aopen(obj, name, H5P_DEFAULT));
  if (!*attr) {
    *why = "cannot be opened: " + take_error_message();
    return -1;
  }
  *type = datatype(H5Aget_type(attr->get()));
  if (H5Tget_class(type->get()) != H5T_STRING) {
    H5Eclear2(H5E_DEFAULT);
    *why = "is not a string (expected a string)";
    return -1;
  }
  *space = dataspace(H5Aget_space(attr->get()));
  int rank = H5Sget_simple_extent_ndims(space->get());
  hssize_t n = H5Sget_simple_extent_npoints(space->get());
  if (rank > 1 || n < 0 || static_cast<size_t>(n) > max_count) {
    H5Eclear2(H5E_DEFAULT);
    *why = "holds " + std::to_string(n) + " strings in " + std::to_string(rank) +
           " dimension(s) (expected at most " + std::to_string(max_count) + " in one)";
    return -1;
  }
  return n;
}
}  // namespace

bool read_attr_strings(hid_t obj, const char* name, std::vector<std::string>* out, size_t max_count,
                       std::string* why) {
  std::string reason;
  if (!why) why = &reason;
  Handle attr, space, type;
  int64_t n = open_string_attr(obj, name, max_count, &attr, &space, &type, why);
  if (n < 0) return false;
  out->clear();
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem = vlen_string_type();
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));  // HDF5 does not convert between charsets
    std::vector<char*> data(static_cast<size_t>(n), nullptr);
    if (n > 0 && H5Aread(attr.get(), mem.get(), data.data()) < 0) {
      *why = "cannot be read: " + take_error_message();
      return false;
    }
    for (char* s : data) out->push_back(s ? s : "");
    if (n > 0) H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, data.data());
    return true;
  }
  size_t len = H5Tget_size(type.get());
  if (len > (1u << 24)) {
    *why =
        "is a fixed-length string of " + std::to_string(len) + " bytes (expected at most 16 MiB)";
    return false;
  }
  Handle mem = datatype(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.get(), len);
  H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
  std::vector<char> buf(static_cast<size_t>(n) * len);
  if (n > 0 && H5Aread(attr.get(), mem.get(), buf.data()) < 0) {
    *why = "cannot be read: " + take_error_message();
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    const char* s = buf.data() + i * len;
    size_t l = 0;
    while (l < len && s[l]) ++l;
    out->emplace_back(s, l);
  }
  return true;
}

bool read_attr_string(hid_t obj, const char* name, std::string* out, std::string* why) {
  std::vector<std::string> values;
  if (!read_attr_strings(obj, name, &values, 1, why)) return false;
  if (values.size() != 1) {
    if (why) *why = "is an empty list of strings (expected one string)";
    return false;
  }
  *out = values[0];
  return true;
}

namespace {
bool read_scalar_attr(hid_t obj, const char* name, H5T_class_t cls, hid_t mem, void* out) {
  if (H5Aexists(obj, name) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  Handle attr = attribute(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr) return false;
  Handle type = datatype(H5Aget_type(attr.get()));
  Handle space = dataspace(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != cls) return false;
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  return H5Aread(attr.get(), mem, out) >= 0;
}
}  // namespace

bool read_attr_i64(hid_t obj, const char* name, int64_t* out) {
  return read_scalar_attr(obj, name, H5T_INTEGER, H5T_NATIVE_INT64, out);
}

bool read_attr_f64(hid_t obj, const char* name, double* out) {
  return read_scalar_attr(obj, name, H5T_FLOAT, H5T_NATIVE_DOUBLE, out);
}

bool read_attr_ints(hid_t obj, const char* name, std::vector<int64_t>* out, size_t max_count,
                    std::string* why) {
  std::string reason;
  if (!why) why = &reason;
  if (H5Aexists(obj, name) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    *why = "missing (expected a list of integers)";
    return false;
  }
  Handle attr = attribute(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr) {
    *why = "cannot be opened: " + take_error_message();
    return false;
  }
  Handle type = datatype(H5Aget_type(attr.get()));
  Handle space = dataspace(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    H5Eclear2(H5E_DEFAULT);
    *why = "is not a list of integers";
    return false;
  }
  const int rank = H5Sget_simple_extent_ndims(space.get());
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (rank > 1 || n < 0 || static_cast<size_t>(n) > max_count) {
    H5Eclear2(H5E_DEFAULT);
    *why = "holds " + std::to_string(n) + " values in " + std::to_string(rank) +
           " dimension(s) (expected at most " + std::to_string(max_count) + " in one)";
    return false;
  }
  out->assign(static_cast<size_t>(n), 0);
  if (n > 0 && H5Aread(attr.get(), H5T_NATIVE_INT64, out->data()) < 0) {
    *why = "cannot be read: " + take_error_message();
    return false;
  }
  return true;
}

std::vector<hsize_t> extent(hid_t dset) {
  Handle space = dataspace(H5Dget_space(dset));
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) return {};
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

}  // namespace kvscope::trace::h5
