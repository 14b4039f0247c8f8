#include "tests/gates/gate_test_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "tests/support/paths.h"

namespace kvscope::test {

model::ModelConfig gate_config(int64_t L, int64_t H, int64_t K, int64_t hd, int64_t D,
                               const std::string& name) {
  model::ModelConfig c;
  c.name = name;
  c.n_layers = L;
  c.n_heads = H;
  c.n_kv_heads = K;
  c.head_dim = hd;
  c.hidden_size = D;
  c.vocab_size = 64;
  c.context_length = 4096;
  c.sliding_window.assign(size_t(L), 0);
  return c;
}

model::ModelConfig stories_shape() {
  return gate_config(5, 8, 4, 8, 64, "stories260K");
}

model::AttentionInputs gate_inputs(const model::ModelConfig& c, int64_t layer, int64_t pos0,
                                   int64_t n, uint64_t seed) {
  torch::manual_seed(seed * 1000003 + uint64_t(pos0) * 31 + uint64_t(layer));
  model::AttentionInputs in;
  in.layer = layer;
  in.pos0 = pos0;
  in.hidden = torch::randn({n, c.hidden_size});
  in.q = torch::randn({n, c.n_heads, c.head_dim});
  in.k_pre_rope = torch::randn({n, c.n_kv_heads, c.head_dim});
  in.k = torch::randn({n, c.n_kv_heads, c.head_dim});
  in.v = torch::randn({n, c.n_kv_heads, c.head_dim});
  in.scale = 1.0 / std::sqrt(double(c.head_dim));
  return in;
}

void randomize(gates::GateSet& set, uint64_t seed, double scale) {
  torch::NoGradGuard g;
  torch::manual_seed(seed);
  for (auto& [name, t] : set.params) t.normal_(0.0, scale);
}

std::string save_temp(const gates::GateSet& set, const std::string& name) {
  std::string path = temp_dir() + "/" + name;
  gates::save_gates(set, path);
  return path;
}

std::string stories_model_path() {
  return shared_dir() + "/models/stories260K/stories260K.bin";
}
std::string stories_tokenizer_path() {
  return shared_dir() + "/models/stories260K/tok512.bin";
}
std::string gate_fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/gates/" + name;
}

std::vector<double> csv_column(const std::string& csv, const std::string& col) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> head;
  std::stringstream hs(line);
  for (std::string c; std::getline(hs, c, ',');) head.push_back(c);
  const size_t k = size_t(std::find(head.begin(), head.end(), col) - head.begin());
  std::vector<double> out;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) f.push_back(c);
    if (f[0] == "train") out.push_back(std::stod(f[k]));
  }
  return out;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

}  // namespace kvscope::test
