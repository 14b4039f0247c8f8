#include "core/common/npy_reader.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <stdexcept>

#include "core/common/atomic_file.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope {

namespace {

// An array this large is no table a policy reads (and would exhaust memory).
constexpr int64_t kMaxElements = int64_t(1) << 28;

uint32_t little_endian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The header is a Python dict literal:
//   {'descr': '<f8', 'fortran_order': False, 'shape': (99, 30, 3), }
std::string header_value(const std::string& path, const std::string& header, const std::string& key,
                         const std::string& pattern) {
  const std::regex re("'" + key + "'\\s*:\\s*(" + pattern + ")");
  std::smatch m;
  if (!std::regex_search(header, m, re))
    throw InputError(path, "npy header '" + key + "'",
                     "missing or malformed (header: " + header.substr(0, 120) + ")");
  return m[1].str();
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& text) {
  std::vector<int64_t> shape;
  const std::regex num("\\d+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), num); it != std::sregex_iterator();
       ++it) {
    const std::string d = it->str();
    if (d.size() > 12)
      throw InputError(path, "npy header 'shape'", "dimension '" + d + "' too large");
    shape.push_back(std::stoll(d));
  }
  return shape;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open the .npy file");
  unsigned char lead[12];
  in.read(reinterpret_cast<char*>(lead), 10);
  if (in.gcount() != 10 || std::memcmp(lead, "\x93NUMPY", 6) != 0)
    throw InputError(path, "magic", "'\\x93NUMPY' expected: not a .npy file");
  const int major = lead[6];
  if (major < 1 || major > 3)
    throw InputError(path, "version",
                     std::to_string(major) + "." + std::to_string(lead[7]) +
                         " is not a .npy version this reader knows (1.0 to 3.0)");
  uint32_t header_len = little_endian(lead + 8, 2);
  if (major >= 2) {
    in.read(reinterpret_cast<char*>(lead + 10), 2);
    if (in.gcount() != 2) throw InputError(path, "header length", "the file ends inside it");
    header_len = little_endian(lead + 8, 4);
  }
  if (header_len > (1u << 20)) throw InputError(path, "header length", "over 1 MiB");
  std::string header(header_len, '\0');
  in.read(&header[0], std::streamsize(header_len));
  if (uint32_t(in.gcount()) != header_len)
    throw InputError(path, "header", "the file ends inside it");
  const std::string descr = header_value(path, header, "descr", "'[^']*'");
  if (descr != "'<f4'" && descr != "'<f8'")
    throw InputError(path, "npy header 'descr'",
                     descr + ": '<f4' or '<f8' expected (little-endian float32 or float64)");
  if (header_value(path, header, "fortran_order", "True|False") != "False")
    throw InputError(path, "npy header 'fortran_order'", "False expected (C order)");
  NpyArray out;
  out.shape = parse_shape(path, header_value(path, header, "shape", "\\([^)]*\\)"));
  int64_t n = 1;
  for (int64_t d : out.shape) {
    n *= d;
    if (n > kMaxElements)
      throw InputError(path, "npy header 'shape'",
                       "more than " + std::to_string(kMaxElements) + " elements");
  }
  const bool f8 = descr == "'<f8'";
  const size_t width = f8 ? 8 : 4;
  std::vector<unsigned char> raw(size_t(n) * width);
  in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
  if (size_t(in.gcount()) != raw.size())
    throw InputError(path, "data",
                     std::to_string(n) + " values of " + std::to_string(width) +
                         " bytes expected; the file ends after " +
                         std::to_string(size_t(in.gcount()) / width));
  out.data.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if (f8) {
      double v;
      std::memcpy(&v, raw.data() + size_t(i) * 8, 8);
      out.data[size_t(i)] = v;
    } else {
      float v;
      std::memcpy(&v, raw.data() + size_t(i) * 4, 4);
      out.data[size_t(i)] = v;
    }
  }
  return out;
}

void write_npy_float32(const std::string& path, const std::vector<int64_t>& shape,
                       const std::vector<float>& data) {
  int64_t count = 1;
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    count *= shape[i];
    dims += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";  // Python's one-element tuple: "(99,)"
  KVSCOPE_CHECK(count == int64_t(data.size()),
                "write_npy_float32: the shape does not match the data");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string file("\x93NUMPY\x01\x00", 8);
  file += char(header.size() & 0xff);
  file += char(header.size() >> 8);
  file += header;
  for (float v : data) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int b = 0; b < 4; ++b) file += char((bits >> (8 * b)) & 0xff);
  }
  write_file_atomically(path, file, "the .npy array");
}

}  // namespace kvscope
