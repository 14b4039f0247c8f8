#include "tests/capture/capture_test_util.h"

#include <cmath>

#include "capture/model/model_loader.h"
#include "tests/support/paths.h"

namespace kvscope::test {

trace::ModelInfo model_info(const model::ModelConfig& c) {
  trace::ModelInfo m;
  m.name = "small";
  m.architecture = "llama";
  m.n_layers = c.n_layers;
  m.n_heads = c.n_heads;
  m.n_kv_heads = c.n_kv_heads;
  m.head_dim = c.head_dim;
  m.vocab_size = c.vocab_size;
  m.context_length = c.context_length;
  return m;
}

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.hidden_size = 128;
  c.vocab_size = 64;
  c.context_length = 4096;
  c.sliding_window.assign(2, 0);
  return c;
}

model::AttentionInputs random_inputs(const model::ModelConfig& c, int64_t layer, int64_t pos0,
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

std::string stories_dir() {
  return shared_dir() + "/models/stories260K";
}

std::unique_ptr<model::Transformer> load_stories() {
  return model::load_model(stories_dir() + "/stories260K.bin",
                           torch::TensorOptions().dtype(torch::kFloat32));
}

}  // namespace kvscope::test
