// Reads (and writes) NumPy's .npy format (versions 1.0 to 3.0): one little-endian float32
// or float64 array in C order, returned as doubles with its shape. Budget
// curves (LU-KV) and other per-head tables come as .npy from the papers'
// repositories. Anything else (big-endian, Fortran order, integers, objects,
// a truncated file) is an InputError naming the file, the field and what was
// expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> data;  // C order
};

NpyArray read_npy(const std::string& path);

// Writes `data` (C order, shape's product of values) as a version 1.0
// little-endian float32 .npy, atomically (core/common/atomic_file.h): what
// `kvscope train --policy lukv` makes, and what read_npy and numpy.load read.
void write_npy_float32(const std::string& path, const std::vector<int64_t>& shape,
                       const std::vector<float>& data);

}  // namespace kvscope
