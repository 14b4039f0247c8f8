#include "tests/fuzz/trace_mutator.h"

#include <hdf5.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/trace/heap_checked_driver.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace kvscope::fuzz {

namespace {

// ---- bookkeeping --------------------------------------------------------------

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h ^ n;
}

// Hashes of inputs the checked reader opened, and of images the mutator wrote.
// Bounded: a long run opens millions of files; forgetting old ones only means
// more byte mutations.
std::unordered_set<uint64_t>& opened_inputs() {
  static std::unordered_set<uint64_t> set;
  return set;
}
constexpr size_t kMaxRemembered = size_t(1) << 20;

// Every global heap collection signature in the image must walk cleanly:
// HDF5 1.10.8 trusts the object sizes in a collection and crashes on bad
// ones, and the core driver (unlike the reader's) does not check them.
bool heaps_ok(const uint8_t* data, size_t size) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  while (end - p >= 4) {
    p = static_cast<const uint8_t*>(std::memchr(p, 'G', size_t(end - p) - 3));
    if (!p) break;
    if (std::memcmp(p, "GCOL", 4) == 0 &&
        !trace::h5::global_heap_image_ok(p, size_t(end - p), /*length_bytes=*/8))
      return false;
    ++p;
  }
  return true;
}

// One HDF5 identifier of any kind, released on scope exit.
class Id {
 public:
  explicit Id(hid_t id = -1) : id_(id) {}
  ~Id() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id& operator=(Id&& other) noexcept {
    std::swap(id_, other.id_);
    return *this;
  }
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }

 private:
  hid_t id_;
};

// ---- what the file holds ------------------------------------------------------

struct Inventory {
  std::vector<std::string> datasets;
  std::vector<std::string> groups{"/"};
  std::vector<std::pair<std::string, std::string>> attrs;  // (object path, attribute)
};

constexpr size_t kMaxObjects = 4096;

herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  auto* inv = static_cast<Inventory*>(data);
  if (info->type != H5L_TYPE_HARD) return 0;  // never follow soft or external links
  Id obj(H5Oopen(group, name, H5P_DEFAULT));
  if (!obj) return 0;
  const std::string path = std::string("/") + name;
  H5I_type_t type = H5Iget_type(obj.get());
  if (type == H5I_DATASET) inv->datasets.push_back(path);
  if (type == H5I_GROUP) inv->groups.push_back(path);
  return inv->datasets.size() + inv->groups.size() > kMaxObjects ? 1 : 0;
}

struct AttrVisit {
  Inventory* inv;
  const std::string* object;
};

herr_t visit_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* v = static_cast<AttrVisit*>(data);
  v->inv->attrs.emplace_back(*v->object, name);
  return v->inv->attrs.size() > kMaxObjects ? 1 : 0;
}

Inventory take_inventory(hid_t file) {
  Inventory inv;
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit_link, &inv);
  std::vector<std::string> objects = inv.groups;
  objects.insert(objects.end(), inv.datasets.begin(), inv.datasets.end());
  for (const std::string& o : objects) {
    Id obj(H5Oopen(file, o.c_str(), H5P_DEFAULT));
    if (!obj) continue;
    AttrVisit v{&inv, &o};
    H5Aiterate2(obj.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, visit_attr, &v);
  }
  H5Eclear2(H5E_DEFAULT);
  return inv;
}

// ---- values ---------------------------------------------------------------------

using Rng = std::minstd_rand;

template <typename T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

double extreme_float(Rng& rng) {
  static const std::vector<double> values = {std::numeric_limits<double>::quiet_NaN(),
                                             std::numeric_limits<double>::infinity(),
                                             -std::numeric_limits<double>::infinity(),
                                             0.0,
                                             -0.0,
                                             -1.0,
                                             1.0,
                                             0.5,
                                             1e300,
                                             -1e300,
                                             3.4028234663852886e38,
                                             65504.0,
                                             1e-310,
                                             2147483648.0,
                                             9.3e18};
  return pick(rng, values);
}

int64_t extreme_int(Rng& rng) {
  static const std::vector<int64_t> values = {-1,
                                              0,
                                              1,
                                              2,
                                              127,
                                              128,
                                              255,
                                              256,
                                              32767,
                                              32768,
                                              65535,
                                              65536,
                                              std::numeric_limits<int32_t>::max(),
                                              std::numeric_limits<int32_t>::min(),
                                              int64_t(1) << 31,
                                              int64_t(std::numeric_limits<uint32_t>::max()),
                                              int64_t(1) << 32,
                                              int64_t(1) << 40,
                                              std::numeric_limits<int64_t>::max(),
                                              std::numeric_limits<int64_t>::min()};
  if (rng() % 8 == 0) return int64_t(rng() % 64) - 8;  // small values near the real ones
  return pick(rng, values);
}

// Fills `bytes` (one element of an integer or float type of that size) with
// an extreme: either a converted value or a raw bit pattern.
void extreme_element(Rng& rng, H5T_class_t cls, size_t size, uint8_t* out) {
  if (rng() % 2 == 0) {  // raw bit patterns (little-endian)
    switch (rng() % 4) {
      case 0:  // -1; NaN
        std::memset(out, 0xFF, size);
        break;
      case 1:  // the type's minimum; -0.0
        std::memset(out, 0x00, size);
        out[size - 1] = 0x80;
        break;
      case 2:  // the type's maximum; NaN
        std::memset(out, 0xFF, size);
        out[size - 1] = 0x7F;
        break;
      default: std::memset(out, 0x00, size);
    }
    return;
  }
  if (cls == H5T_FLOAT) {
    const double d = extreme_float(rng);
    if (size == 4) {
      const float f = static_cast<float>(d);
      std::memcpy(out, &f, 4);
    } else if (size == 8) {
      std::memcpy(out, &d, 8);
    } else {
      std::memset(out, 0xFF, size);  // half: NaN
    }
    return;
  }
  const int64_t v = extreme_int(rng);
  std::memcpy(out, &v, std::min<size_t>(size, 8));  // truncation keeps the low bytes
}

// ---- mutations ------------------------------------------------------------------

struct Context {
  hid_t file;
  Inventory inv;
  Rng rng;
};

bool set_dataset_element(Context& c) {
  if (c.inv.datasets.empty()) return false;
  const std::string& path = pick(c.rng, c.inv.datasets);
  Id d(H5Dopen2(c.file, path.c_str(), H5P_DEFAULT));
  if (!d) return false;
  Id ftype(H5Dget_type(d.get()));
  H5T_class_t cls = H5Tget_class(ftype.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) return false;
  Id mtype(H5Tget_native_type(ftype.get(), H5T_DIR_DEFAULT));
  if (!mtype) return false;
  const size_t size = H5Tget_size(mtype.get());
  if (size == 0 || size > 16) return false;
  Id space(H5Dget_space(d.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > 8) return false;
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::vector<hsize_t> coord(static_cast<size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    if (dims[size_t(i)] == 0) return false;
    // Often the first or last element: counts and offsets live there.
    const unsigned r = c.rng() % 4;
    coord[size_t(i)] = r == 0 ? 0 : r == 1 ? dims[size_t(i)] - 1 : c.rng() % dims[size_t(i)];
  }
  if (rank > 0 && H5Sselect_elements(space.get(), H5S_SELECT_SET, 1, coord.data()) < 0)
    return false;
  Id mspace(H5Screate(H5S_SCALAR));
  uint8_t value[16] = {};
  extreme_element(c.rng, cls, size, value);
  return H5Dwrite(d.get(), mtype.get(), mspace.get(), rank > 0 ? space.get() : H5S_ALL, H5P_DEFAULT,
                  value) >= 0;
}

bool is_string_attr(hid_t a, bool* vlen) {
  Id type(H5Aget_type(a));
  if (H5Tget_class(type.get()) != H5T_STRING) return false;
  *vlen = H5Tis_variable_str(type.get()) > 0;
  return true;
}

// Reads a string attribute (scalar or 1-D, variable or fixed length).
bool read_strings(hid_t a, std::vector<std::string>* out) {
  bool vlen = false;
  if (!is_string_attr(a, &vlen)) return false;
  Id space(H5Aget_space(a));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > 256) return false;
  Id ftype(H5Aget_type(a));
  if (vlen) {
    Id mtype(H5Tcopy(H5T_C_S1));
    H5Tset_size(mtype.get(), H5T_VARIABLE);
    std::vector<char*> ptrs(size_t(n), nullptr);
    if (n > 0 && H5Aread(a, mtype.get(), ptrs.data()) < 0) return false;
    for (char* p : ptrs) out->push_back(p ? p : "");
    if (n > 0) H5Dvlen_reclaim(mtype.get(), space.get(), H5P_DEFAULT, ptrs.data());
    return true;
  }
  const size_t len = H5Tget_size(ftype.get());
  if (len == 0 || len > (1u << 16)) return false;
  std::vector<char> buf(len * size_t(n));
  if (n > 0 && H5Aread(a, ftype.get(), buf.data()) < 0) return false;
  for (hssize_t i = 0; i < n; ++i) {
    const char* s = buf.data() + size_t(i) * len;
    out->push_back(std::string(s, strnlen(s, len)));
  }
  return true;
}

// (Re)creates attribute `name` on `obj` holding `values` as strings.
bool write_strings(hid_t obj, const std::string& name, const std::vector<std::string>& values,
                   bool scalar, bool vlen) {
  if (H5Aexists(obj, name.c_str()) > 0 && H5Adelete(obj, name.c_str()) < 0) return false;
  Id type(H5Tcopy(H5T_C_S1));
  size_t longest = 1;
  for (const std::string& v : values) longest = std::max(longest, v.size() + 1);
  H5Tset_size(type.get(), vlen ? H5T_VARIABLE : longest);
  hsize_t n = values.size();
  Id space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr));
  Id a(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a) return false;
  if (values.empty()) return true;
  if (vlen) {
    std::vector<const char*> ptrs;
    for (const std::string& v : values) ptrs.push_back(v.c_str());
    return H5Awrite(a.get(), type.get(), ptrs.data()) >= 0;
  }
  std::vector<char> buf(longest * values.size(), 0);
  for (size_t i = 0; i < values.size(); ++i)
    std::memcpy(buf.data() + i * longest, values[i].data(), values[i].size());
  return H5Awrite(a.get(), type.get(), buf.data()) >= 0;
}

std::string mutate_string(Rng& rng, const std::string& s) {
  switch (rng() % 7) {
    case 0: return s.substr(0, s.empty() ? 0 : rng() % s.size());  // truncated
    case 1: return "";
    case 2: return s + "\xff";                          // invalid UTF-8
    case 3: return s.substr(0, s.size() / 2) + "\xc3";  // a cut multi-byte character
    case 4: return std::string(300 + rng() % 1000, 'x');
    case 5: {
      std::string t = s;
      if (!t.empty()) t[rng() % t.size()] = '\0';  // an embedded NUL (fixed strings end there)
      return t;
    }
    default: return "{\"a\": [1, 2, " + s + "]";  // JSON-ish fields (policy_params, run_json)
  }
}

bool set_attribute(Context& c) {
  if (c.inv.attrs.empty()) return false;
  const auto& [object, name] = pick(c.rng, c.inv.attrs);
  Id obj(H5Oopen(c.file, object.c_str(), H5P_DEFAULT));
  if (!obj) return false;
  Id a(H5Aopen(obj.get(), name.c_str(), H5P_DEFAULT));
  if (!a) return false;
  bool vlen = false;
  if (is_string_attr(a.get(), &vlen)) {
    std::vector<std::string> values;
    if (!read_strings(a.get(), &values)) return false;
    Id space(H5Aget_space(a.get()));
    const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
    if (!values.empty()) {
      std::string& v = values[c.rng() % values.size()];
      v = mutate_string(c.rng, v);
    }
    if (!scalar && c.rng() % 4 == 0) {  // one name more, or one fewer
      if (c.rng() % 2 == 0 && !values.empty())
        values.pop_back();
      else
        values.push_back(values.empty() ? "x" : values.front());
    }
    a = Id();
    return write_strings(obj.get(), name, values, scalar && values.size() == 1, vlen);
  }
  Id ftype(H5Aget_type(a.get()));
  const H5T_class_t cls = H5Tget_class(ftype.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) return false;
  Id mtype(H5Tget_native_type(ftype.get(), H5T_DIR_DEFAULT));
  const size_t size = H5Tget_size(mtype.get());
  Id space(H5Aget_space(a.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (size == 0 || size > 16 || n <= 0 || n > 4096) return false;
  std::vector<uint8_t> buf(size * size_t(n));
  if (H5Aread(a.get(), mtype.get(), buf.data()) < 0) return false;
  extreme_element(c.rng, cls, size, buf.data() + size * (c.rng() % size_t(n)));
  return H5Awrite(a.get(), mtype.get(), buf.data()) >= 0;
}

bool resize_dataset(Context& c) {
  if (c.inv.datasets.empty()) return false;
  const std::string& path = pick(c.rng, c.inv.datasets);
  Id d(H5Dopen2(c.file, path.c_str(), H5P_DEFAULT));
  if (!d) return false;
  Id dcpl(H5Dget_create_plist(d.get()));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return false;
  Id space(H5Dget_space(d.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank <= 0 || rank > 8) return false;
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), max(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), max.data());
  const size_t axis = c.rng() % size_t(rank);
  const hsize_t d0 = dims[axis];
  const std::vector<hsize_t> choices = {0,        1, d0 / 2, d0 + 1, 2 * d0 + 1, hsize_t(1) << 31,
                                        max[axis]};
  hsize_t v = pick(c.rng, choices);
  if (max[axis] != H5S_UNLIMITED && v > max[axis]) v = max[axis];
  if (v == H5S_UNLIMITED) v = hsize_t(1) << 31;
  dims[axis] = v;
  return H5Dset_extent(d.get(), dims.data()) >= 0;
}

bool delete_something(Context& c) {
  const size_t n_objects = c.inv.datasets.size() + c.inv.groups.size() - 1;  // not "/"
  const size_t total = n_objects + c.inv.attrs.size();
  if (total == 0) return false;
  size_t i = c.rng() % total;
  if (i < c.inv.datasets.size())
    return H5Ldelete(c.file, c.inv.datasets[i].c_str(), H5P_DEFAULT) >= 0;
  i -= c.inv.datasets.size();
  if (i + 1 < c.inv.groups.size())
    return H5Ldelete(c.file, c.inv.groups[i + 1].c_str(), H5P_DEFAULT) >= 0;
  i -= c.inv.groups.size() - 1;
  const auto& [object, name] = c.inv.attrs[i];
  return H5Adelete_by_name(c.file, object.c_str(), name.c_str(), H5P_DEFAULT) >= 0;
}

// A new attribute or dataset value of a random type: the same name with a
// type the reader does not expect.
struct TypedValue {
  hid_t type;  // a predefined type (not to be closed) or a string type made here
  std::vector<uint8_t> bytes;
  std::string text;
  bool is_string = false;
};

TypedValue random_value(Rng& rng) {
  static const std::vector<hid_t>* ints = nullptr;
  if (!ints)
    ints = new std::vector<hid_t>{H5T_NATIVE_INT8,   H5T_NATIVE_UINT8,  H5T_NATIVE_INT16,
                                  H5T_NATIVE_UINT16, H5T_NATIVE_INT32,  H5T_NATIVE_UINT32,
                                  H5T_NATIVE_INT64,  H5T_NATIVE_UINT64, H5T_NATIVE_FLOAT,
                                  H5T_NATIVE_DOUBLE};
  TypedValue v;
  if (rng() % 4 == 0) {
    v.is_string = true;
    v.type = H5T_C_S1;
    static const std::vector<std::string> texts = {"",    "kvscope-trace", "1",   "-1",
                                                   "nan", "\xff\xfe",      "hot", "{}"};
    v.text = pick(rng, texts);
    return v;
  }
  v.type = pick(rng, *ints);
  const size_t size = H5Tget_size(v.type);
  v.bytes.resize(size);
  const H5T_class_t cls = H5Tget_class(v.type);
  extreme_element(rng, cls, size, v.bytes.data());
  return v;
}

bool replace_attribute_type(Context& c) {
  if (c.inv.attrs.empty()) return false;
  const auto& [object, name] = pick(c.rng, c.inv.attrs);
  Id obj(H5Oopen(c.file, object.c_str(), H5P_DEFAULT));
  if (!obj || H5Adelete(obj.get(), name.c_str()) < 0) return false;
  TypedValue v = random_value(c.rng);
  if (v.is_string) return write_strings(obj.get(), name, {v.text}, c.rng() % 2 == 0, true);
  const unsigned shape = c.rng() % 4;  // scalar, [1], [2], or no elements (H5S_NULL)
  hsize_t n = shape == 1 ? 1 : 2;
  Id space(shape == 0   ? H5Screate(H5S_SCALAR)
           : shape == 3 ? H5Screate(H5S_NULL)
                        : H5Screate_simple(1, &n, nullptr));
  Id a(H5Acreate2(obj.get(), name.c_str(), v.type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a) return false;
  if (shape == 3) return true;
  std::vector<uint8_t> buf;
  for (hsize_t i = 0; i < (shape == 0 ? 1 : n); ++i)
    buf.insert(buf.end(), v.bytes.begin(), v.bytes.end());
  return H5Awrite(a.get(), v.type, buf.data()) >= 0;
}

bool swap_datasets(Context& c) {
  if (c.inv.datasets.size() < 2) return false;
  const std::string a = pick(c.rng, c.inv.datasets), b = pick(c.rng, c.inv.datasets);
  if (a == b) return false;
  const char* tmp = "/kvscope_fuzz_swap";
  return H5Lmove(c.file, a.c_str(), c.file, tmp, H5P_DEFAULT, H5P_DEFAULT) >= 0 &&
         H5Lmove(c.file, b.c_str(), c.file, a.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0 &&
         H5Lmove(c.file, tmp, c.file, b.c_str(), H5P_DEFAULT, H5P_DEFAULT) >= 0;
}

bool replace_dataset(Context& c) {
  if (c.inv.datasets.empty()) return false;
  const std::string path = pick(c.rng, c.inv.datasets);
  if (H5Ldelete(c.file, path.c_str(), H5P_DEFAULT) < 0) return false;
  TypedValue v = random_value(c.rng);
  const int rank = int(c.rng() % 5);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  hsize_t n = 1;
  for (hsize_t& d : dims) n *= (d = c.rng() % 5);
  Id space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr));
  Id str_type;
  hid_t type = v.type;
  if (v.is_string) {
    str_type = Id(H5Tcopy(H5T_C_S1));
    H5Tset_size(str_type.get(), v.text.size() + 1);
    type = str_type.get();
  }
  Id d(H5Dcreate2(c.file, path.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!d) return false;
  if (n == 0) return true;
  std::vector<uint8_t> buf;
  for (hsize_t i = 0; i < n; ++i) {
    if (v.is_string)
      buf.insert(buf.end(), v.text.c_str(), v.text.c_str() + v.text.size() + 1);
    else
      buf.insert(buf.end(), v.bytes.begin(), v.bytes.end());
  }
  return H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0;
}

void silence_hdf5() {
  static bool done = false;
  if (!done) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  done = true;
}

}  // namespace

void note_trace_opened(const uint8_t* data, size_t size) {
  auto& set = opened_inputs();
  if (set.size() >= kMaxRemembered) set.clear();
  set.insert(fnv1a(data, size));
}

namespace {

size_t mutate_in_process(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  silence_hdf5();
  size_t out_size = 0;
  {
    Id fapl(H5Pcreate(H5P_FILE_ACCESS));
    // In memory only: no backing store, the image is copied in.
    if (H5Pset_fapl_core(fapl.get(), 1 << 16, /*backing_store=*/0) < 0 ||
        H5Pset_file_image(fapl.get(), data, size) < 0)
      return 0;
    // A trace a writer still held (SWMR flags set) refuses a read-write
    // open: those inputs get byte mutations only.
    Id file(H5Fopen("kvscope-fuzz-image.h5", H5F_ACC_RDWR, fapl.get()));
    if (!file) {
      H5Eclear2(H5E_DEFAULT);
      return 0;
    }
    Context c{file.get(), take_inventory(file.get()), Rng(seed)};
    bool (*const mutations[])(Context&) = {
        set_dataset_element, set_dataset_element,    set_dataset_element, set_attribute,
        set_attribute,       set_attribute,          resize_dataset,      resize_dataset,
        delete_something,    replace_attribute_type, swap_datasets,       replace_dataset};
    bool changed = false;
    for (int attempt = 0; attempt < 4 && !changed; ++attempt)
      changed = mutations[c.rng() % std::size(mutations)](c);
    if (changed && H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0) {
      const ssize_t n = H5Fget_file_image(file.get(), nullptr, 0);
      if (n > 0 && size_t(n) <= max_size && H5Fget_file_image(file.get(), data, size_t(n)) == n)
        out_size = size_t(n);
    }
  }
  H5Eclear2(H5E_DEFAULT);
  return out_size;
}

// The core driver reads all of the file (every group, link and attribute),
// much of which the checked reader never looked at, and HDF5 1.10 can still
// crash on damage there. So the mutation runs in a helper process writing
// into shared memory: a crash or hang inside HDF5 costs one mutation (the
// caller falls back to bytes) and a new helper, not the fuzzing run, and is
// not mistaken for a finding of the target. The helper is forked once and
// fed through a pipe: forking the whole (sanitized) fuzzer for every
// mutation cost more than the target's own run.
class MutatorHelper {
 public:
  ~MutatorHelper() { stop(); }

  // The mutated size, or 0 when the helper failed or died (a new one starts next time).
  size_t mutate(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
    const size_t need = std::max(size, max_size);
    if (pid_ > 0 && (capacity_ < need || jobs_ >= kJobsPerHelper)) stop();
    if (pid_ < 0 && !start(need)) return 0;
    Job* job = reinterpret_cast<Job*>(shared_);
    std::memcpy(image(), data, size);
    *job = Job{size, max_size, seed, 0};
    ++jobs_;
    const char go = 1;
    char done = 0;
    if (write(to_helper_, &go, 1) != 1 || !read_byte(from_helper_, &done)) {
      stop();  // it crashed or hung (its alarm ended it): this mutation fails
      return 0;
    }
    const uint64_t n = job->result;
    if (n == 0 || n > max_size) return 0;
    std::memcpy(data, image(), n);
    return n;
  }

 private:
  struct Job {
    uint64_t size, max_size, seed, result;
  };
  static constexpr uint64_t kJobsPerHelper = 4096;  // bounds what HDF5 may leak in the helper

  uint8_t* image() const { return shared_ + sizeof(Job); }

  static bool read_byte(int fd, char* c) {
    ssize_t n;
    while ((n = read(fd, c, 1)) < 0 && errno == EINTR) {
    }
    return n == 1;
  }

  bool start(size_t need) {
    if (capacity_ < need) {
      if (shared_) munmap(shared_, sizeof(Job) + capacity_);
      void* p = mmap(nullptr, sizeof(Job) + need, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      shared_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
      capacity_ = shared_ ? need : 0;
      if (!shared_) return false;
    }
    int down[2], up[2];
    if (pipe(down) != 0) return false;
    if (pipe(up) != 0) {
      close(down[0]), close(down[1]);
      return false;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      for (int fd : {down[0], down[1], up[0], up[1]}) close(fd);
      return false;
    }
    if (pid == 0) {
      close(down[1]), close(up[0]);
      serve(down[0], up[1]);
    }
    close(down[0]), close(up[1]);
    pid_ = pid, to_helper_ = down[1], from_helper_ = up[0], jobs_ = 0;
    return true;
  }

  // The helper's loop: one mutation per byte received, until the pipe closes.
  [[noreturn]] void serve(int in, int out) {
    Job* job = reinterpret_cast<Job*>(shared_);
    char go = 0;
    while (read_byte(in, &go)) {
      alarm(10);  // a hang in HDF5 ends the helper, not the run
      job->result =
          mutate_in_process(image(), size_t(job->size), size_t(job->max_size), unsigned(job->seed));
      alarm(0);
      if (write(out, &go, 1) != 1) break;
    }
    _exit(0);  // no atexit handlers, no leak check: the fuzzer owns those
  }

  void stop() {
    if (pid_ < 0) return;
    close(to_helper_), close(from_helper_);
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int to_helper_ = -1, from_helper_ = -1;
  uint8_t* shared_ = nullptr;
  size_t capacity_ = 0;
  uint64_t jobs_ = 0;
};

}  // namespace

size_t mutate_hdf5_image(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  if (size < 8 || !opened_inputs().count(fnv1a(data, size)) || !heaps_ok(data, size)) return 0;
  static MutatorHelper helper;
  const size_t n = helper.mutate(data, size, max_size, seed);
  // HDF5 wrote this image itself: the next mutation of the same round (libFuzzer
  // stacks several before it runs the input) may take the API path too.
  if (n > 0) note_trace_opened(data, n);
  return n;
}

}  // namespace kvscope::fuzz

// libFuzzer's hook: an API-level mutation 3 times in 4 when the input opens,
// byte mutations otherwise.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  // How often the API mutation succeeds (KVSCOPE_FUZZ_VERBOSE=1 prints it).
  static uint64_t calls = 0, structured = 0;
  if (++calls % 1024 == 0 && kvscope::fuzz::verbose())
    std::fprintf(stderr, "trace mutator: %llu of %llu mutations through the HDF5 API\n",
                 (unsigned long long)structured, (unsigned long long)calls);
  if (seed % 4 != 0) {
    // The image is only overwritten once the mutation succeeded, so a failed
    // attempt leaves the input as it was for the byte mutator.
    if (size_t n = kvscope::fuzz::mutate_hdf5_image(data, size, max_size, seed)) {
      ++structured;
      return n;
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
