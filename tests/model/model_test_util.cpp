#include "tests/model/model_test_util.h"

#include <cstring>
#include <stdexcept>

#include "tests/support/paths.h"

namespace kvscope::test {

std::string model_fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/model/" + name;
}

torch::Tensor read_tensor(const formats::SafetensorsFile& file, const std::string& name) {
  const formats::StTensor* t = file.find(name);
  if (!t) throw std::runtime_error(file.path() + ": no tensor " + name);
  torch::ScalarType type;
  if (t->dtype == formats::StDtype::F32)
    type = torch::kFloat32;
  else if (t->dtype == formats::StDtype::I64)
    type = torch::kInt64;
  else
    throw std::runtime_error(file.path() + ": " + name + " is neither F32 nor I64");
  torch::Tensor out = torch::empty(t->shape, type);
  std::memcpy(out.data_ptr(), file.data(*t), t->nbytes);
  return out;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace kvscope::test
