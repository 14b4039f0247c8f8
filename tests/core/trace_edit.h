// Raw HDF5 edits of a trace for the damaged-file tests: attributes,
// datasets and single values changed through the HDF5 API.
#pragma once

#include <hdf5.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::test {

// Opens a trace for editing with the raw HDF5 API (the file is closed cleanly,
// so a plain read-write open works).
struct Edit {
  hid_t file;
  explicit Edit(const std::string& path) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
  }
  ~Edit() { H5Fclose(file); }

  void set_i64_attr(const char* object, const char* name, int64_t value) {
    replace_attr(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
  }
  void set_string_attr(const char* object, const char* name, const char* value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    replace_attr(object, name, type, type, &value);
    H5Tclose(type);
  }
  // Deletes the attribute `name` of `object` and writes a scalar one in its place.
  void replace_attr(const char* object, const char* name, hid_t file_type, hid_t mem_type,
                    const void* value) {
    hid_t obj = H5Oopen(file, object, H5P_DEFAULT);
    H5Adelete(obj, name);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attr, mem_type, value) >= 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Oclose(obj);
  }
  void remove(const char* path) { REQUIRE(H5Ldelete(file, path, H5P_DEFAULT) >= 0); }
  void remove_attr(const char* object, const char* name) {
    hid_t obj = H5Oopen(file, object, H5P_DEFAULT);
    REQUIRE(H5Adelete(obj, name) >= 0);
    H5Oclose(obj);
  }
  // Deletes the attribute `name` of `object` and writes a 1-D uint8 one.
  void set_u8s_attr(const char* object, const char* name, const std::vector<uint8_t>& values) {
    replace_1d_attr(object, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, values.size(), values.data());
  }
  // Deletes the attribute `name` of `object` and writes `n` values of
  // `mem_type` from `data` as a 1-D one of `file_type`.
  void replace_1d_attr(const char* object, const char* name, hid_t file_type, hid_t mem_type,
                       hsize_t n, const void* data) {
    hid_t obj = H5Oopen(file, object, H5P_DEFAULT);
    H5Adelete(obj, name);
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attr, mem_type, data) >= 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Oclose(obj);
  }
  // Replaces a 1-D dataset with a float32 one of the same length.
  void retype_to_float(const char* path) {
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    hid_t space = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    H5Sclose(space);
    H5Dclose(d);
    remove(path);
    hsize_t maxd = H5S_UNLIMITED, chunk = 64;
    hid_t s = H5Screate_simple(1, &n, &maxd);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    hid_t nd = H5Dcreate2(file, path, H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(nd >= 0);
    H5Dclose(nd);
    H5Pclose(dcpl);
    H5Sclose(s);
  }
  // Replaces a dataset with an empty-valued one of another type or shape
  // (chunked, axis 0 extendible, like the writer's), attributes units and
  // meaning included so only the type or shape is wrong.
  void replace_dataset(const char* path, hid_t file_type, std::vector<hsize_t> dims) {
    remove(path);
    std::vector<hsize_t> maxd = dims, chunk = dims;
    maxd[0] = H5S_UNLIMITED;
    for (hsize_t& c : chunk) c = c > 0 ? c : 1;
    hid_t s = H5Screate_simple(int(dims.size()), dims.data(), maxd.data());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    hid_t d = H5Dcreate2(file, path, file_type, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    REQUIRE(d >= 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
    set_string_attr(path, "units", "1");
    set_string_attr(path, "meaning", "replaced by a test");
  }
  // Deletes the attribute `name` of `object` and writes a list of strings.
  void set_strings_attr(const char* object, const char* name,
                        const std::vector<std::string>& values) {
    std::vector<const char*> ptrs;
    for (const std::string& v : values) ptrs.push_back(v.c_str());
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    replace_1d_attr(object, name, type, type, values.size(), ptrs.data());
    H5Tclose(type);
  }
  void extend(const char* path, hsize_t by) {
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    hid_t space = H5Dget_space(d);
    hsize_t dims[4];
    int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
    REQUIRE(rank >= 1);
    dims[0] += by;
    REQUIRE(H5Dset_extent(d, dims) >= 0);
    H5Sclose(space);
    H5Dclose(d);
  }
  void write_i64(const char* path, hsize_t index, int64_t value) {
    write_element(path, index, H5T_NATIVE_INT64, &value);
  }
  void write_f64(const char* path, hsize_t index, double value) {
    write_element(path, index, H5T_NATIVE_DOUBLE, &value);
  }
  // Element `index` of the dataset in row-major order (any rank).
  void write_element(const char* path, hsize_t index, hid_t mem_type, const void* value) {
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    REQUIRE(d >= 0);
    hid_t fs = H5Dget_space(d);
    hsize_t dims[8], at[8];
    const int rank = H5Sget_simple_extent_dims(fs, dims, nullptr);
    REQUIRE(rank >= 1);
    for (int i = rank - 1; i >= 0; --i) {
      at[i] = index % dims[i];
      index /= dims[i];
    }
    REQUIRE(H5Sselect_elements(fs, H5S_SELECT_SET, 1, at) >= 0);
    hsize_t one = 1;
    hid_t ms = H5Screate_simple(1, &one, nullptr);
    REQUIRE(H5Dwrite(d, mem_type, ms, fs, H5P_DEFAULT, value) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
  }
};

}  // namespace kvscope::test
