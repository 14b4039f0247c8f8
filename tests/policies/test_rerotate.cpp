// Key re-rotation (`+rerotate`, kvpress KeyRerotationPress): after the
// prefill's compression the i-th kept key of every head carries RoPE
// position i. The rotation is recomputed here in double precision from the
// model's RoPE settings (rotate-half pairs, inverse frequencies
// theta^(-2j/d)), not with the capture's own tables.
#include <cmath>
#include <map>

#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

namespace {

// R(delta) x for one head_dim vector, in double.
std::vector<double> rotate(const torch::Tensor& x, int64_t delta, double theta) {
  const int64_t d = x.size(0), half = d / 2;
  const torch::Tensor xd = x.to(torch::kFloat64);
  std::vector<double> out(static_cast<size_t>(d));
  for (int64_t j = 0; j < half; ++j) {
    const double freq = std::pow(theta, -2.0 * double(j) / double(d));
    const double a = double(delta) * freq, c = std::cos(a), s = std::sin(a);
    const double lo = xd[j].item<double>(), hi = xd[j + half].item<double>();
    out[size_t(j)] = lo * c - hi * s;
    out[size_t(j + half)] = hi * c + lo * s;
  }
  return out;
}

// Every held key against its prompt key rotated to the position the
// re-rotations so far gave it (its own position without a row). Returns the
// number of held entries whose position moved.
int64_t check_held_keys(PolicyRun& run, const model::ModelConfig& c,
                        const std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t>& position) {
  const int64_t hd = c.head_dim;
  int64_t moved = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerInputs in = run.all_inputs(l);  // keys with RoPE at their own positions
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      INFO("layer " << l << ", kv head " << h);
      std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
      for (int64_t p : run.held(l, h)) {
        auto it = position.find({l, h, p});
        const int64_t at = it == position.end() ? p : it->second;
        moved += at != p;
        run.cache().read_entry(l, h, p, k.data(), v.data());
        const std::vector<double> want = rotate(in.k[p][h], at - p, c.rope.theta);
        double err = 0, norm = 1;
        for (int64_t j = 0; j < hd; ++j) {
          err = std::max(err, std::abs(double(k[size_t(j)]) - want[size_t(j)]));
          norm = std::max(norm, std::abs(want[size_t(j)]));
        }
        INFO("entry " << p << " at RoPE position " << at);
        CHECK(err <= 1e-5 * norm);
        CHECK((torch::tensor(v) - in.v[p][h]).abs().max().item<float>() == 0);
      }
    }
  }
  return moved;
}

}  // namespace

TEST_CASE("rerotate: the i-th kept key of a head carries RoPE position i, values untouched",
          "[policies][rerotate]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  REQUIRE(c.rope.enabled);
  REQUIRE(c.rope.dim == c.head_dim);
  REQUIRE(c.rope.scaling == model::RopeConfig::Scaling::None);
  REQUIRE(c.rope.freq_divisors.empty());
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t n = int64_t(prompt.size()), budget = 12;
  PolicyRun plain(*model, "knorm:budget=" + std::to_string(budget), n + 4, n);
  PolicyRun run(*model, "knorm:budget=" + std::to_string(budget) + "+rerotate", n + 4, n);
  plain.feed(*model, prompt, 0);
  run.feed(*model, prompt, 0);

  // The prefill: the i-th kept entry of each head (position order) is at i,
  // with a row exactly when it moved.
  std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t> position;
  for (const trace::RerotationRow& r : run.last_rerotations()) {
    CHECK(r.step == 0);
    CHECK(position
              .emplace(std::make_tuple(int64_t(r.layer), int64_t(r.kv_head), int64_t(r.token)),
                       r.position)
              .second);
  }
  REQUIRE(!position.empty());
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const std::set<int64_t> kept = run.held(l, h);
      REQUIRE(kept == plain.held(l, h));  // re-rotation never changes which entries stay
      int32_t i = 0;
      for (int64_t p : kept) {
        auto it = position.find({l, h, p});
        if (p == i)
          CHECK(it == position.end());
        else
          CHECK((it != position.end() && it->second == i));
        ++i;
      }
    }
  CHECK(check_held_keys(run, c, position) == int64_t(position.size()));

  // Decode steps: whatever they compress, every held key matches the
  // positions recorded so far, and the logits read the re-rotated keys.
  for (int64_t s = 1; s <= 3; ++s) {
    const torch::Tensor a = plain.feed(*model, {prompt[size_t(s)]}, n + s - 1);
    const torch::Tensor b = run.feed(*model, {prompt[size_t(s)]}, n + s - 1);
    for (const trace::RerotationRow& r : run.last_rerotations()) {
      CHECK(r.step == s);
      position[{r.layer, r.kv_head, r.token}] = r.position;
    }
    INFO("decode step " << s);
    check_held_keys(run, c, position);
    CHECK(torch::isfinite(b).all().item<bool>());
    CHECK((a - b).abs().max().item<float>() > 0);
  }
}

}  // namespace kvscope::test
