#include "tests/gates/gate_test_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "capture/attention/step_driver.h"
#include "capture/policy/registry.h"
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

gates::GateSet kvpop_set(gates::GateKind kind, const model::ModelConfig& c, nlohmann::json given,
                         uint64_t seed) {
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet set =
      gates::init_gates(kind, gates::resolve_hyperparameters(kind, shape, given, ""), shape, seed);
  randomize(set, seed);
  return set;
}

nlohmann::json small_gate() {
  return {{"dim", 4}, {"base_keys", 3}};
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

std::string write_story_text(const std::string& name, int repeats) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream file(path);
  for (int i = 0; i < repeats; ++i)
    file << "Once upon a time there was a little dog named Max. Max liked to run in "
            "the park with his friend Sue. One day they found a big red ball under a "
            "tree and played until the sun went down. Then they went home and slept. "
            "The next morning the sky was blue and the birds were singing.\n";
  return path;
}

Prefilled prefill_policy(const model::ModelConfig& c, const std::string& spec, int64_t n,
                         uint64_t seed) {
  const int64_t max_tokens = n + 16;
  policy::PolicyInstance pi = policy::make_policy(spec);
  pi.policy->setup({&c, max_tokens, n, 16});
  policy::StepDriver driver(c, policy::StepDriver::Options{16, max_tokens, n}, *pi.policy, "test");
  torch::InferenceMode guard;
  Prefilled out;
  driver.begin_step(0, n);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    model::AttentionInputs in = gate_inputs(c, l, 0, n, seed);
    out.hidden.push_back(in.hidden.clone());
    driver.attend(in);
  }
  driver.end_step();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    out.held.emplace_back();
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const auto& pos = driver.cache().positions(l, h, 0);
      out.held.back().emplace_back(pos.begin(), pos.end());
    }
  }
  return out;
}

}  // namespace kvscope::test
