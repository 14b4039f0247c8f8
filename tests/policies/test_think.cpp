// ThinK (`think`, kvpress ThinKPress): the pruned key channels recomputed here
// from the prompt's queries and keys as the paper scores them, the thin keys
// checked in storage (pruned channels read 0, kept ones as written, values
// whole, fewer bytes), and a decode step's attention checked against
// softmax(q . k) over keys with the pruned channels zeroed.
#include <algorithm>

#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

namespace {

constexpr int64_t kWindow = 8, kDecode = 2;

// The channels the paper drops for head h of one layer: the n_pruned lowest of
// mean_i q_ic^2 (last kWindow prompt queries, mean over the group's heads)
// times mean_j k_jc^2 (the held prompt keys).
std::set<int64_t> expected_pruned(const LayerInputs& prefill, int64_t h, int64_t R,
                                  int64_t n_pruned) {
  const int64_t n = prefill.q.size(0);
  const torch::Tensor q = prefill.q.narrow(0, n - kWindow, kWindow).to(torch::kFloat64);
  const torch::Tensor qn = q.pow(2).mean(0).narrow(0, h * R, R).mean(0);  // [hd]
  const torch::Tensor kn = prefill.k.select(1, h).to(torch::kFloat64).pow(2).mean(0);
  const torch::Tensor low = std::get<1>((qn * kn).topk(n_pruned, -1, false));
  std::set<int64_t> out;
  for (int64_t i = 0; i < n_pruned; ++i) out.insert(low[i].item<int64_t>());
  return out;
}

}  // namespace

TEST_CASE("think: each head drops the channels the paper's score names, and the thin keys shrink",
          "[policies][think]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t n = int64_t(prompt.size());
  const model::ModelConfig& c = model->config();
  const int64_t L = c.n_layers, K = c.n_kv_heads, hd = c.head_dim, R = c.n_heads / K;
  const int64_t n_pruned = hd / 2;
  PolicyRun run(*model, "think:ratio=0.5,window=" + std::to_string(kWindow), n + kDecode + 1, n);
  std::vector<trace::KeyChannelRow> rows;
  std::vector<std::vector<HeadProbs>> decode_probs;
  run.generate(*model, prompt, kDecode, [&](int64_t s) {
    if (s == 0) rows = run.last_key_channels();
    if (s == kDecode) decode_probs = run.last_probs();
  });
  REQUIRE(int64_t(rows.size()) == L * K * n_pruned);
  const cache::RaggedKvCache& cache = run.cache();
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h) {
      INFO("layer " << l << ", kv head " << h);
      std::set<int64_t> pruned;
      for (const trace::KeyChannelRow& r : rows)
        if (r.layer == l && r.kv_head == h) pruned.insert(r.channel);
      const LayerInputs& prefill = run.steps()[0][size_t(l)];
      CHECK(pruned == expected_pruned(prefill, h, R, n_pruned));
      // The prompt's keys live in the thin tier, the decode tokens' whole.
      CHECK(cache.count(l, h, 1) == n);
      CHECK(cache.count(l, h, 0) == kDecode);
      std::vector<float> key(static_cast<size_t>(hd)), value(static_cast<size_t>(hd));
      for (int64_t pos : {int64_t(0), n / 2, n - 1}) {
        cache.read_entry(l, h, pos, key.data(), value.data());
        for (int64_t ch = 0; ch < hd; ++ch) {
          const float written = prefill.k[pos][h][ch].item<float>();
          CHECK(key[size_t(ch)] == (pruned.count(ch) ? 0.0f : written));
          CHECK(value[size_t(ch)] == prefill.v[pos][h][ch].item<float>());
        }
      }
    }
  // Thin rows store hd - n_pruned key floats and hd value floats.
  const std::vector<int64_t> bytes = cache.tier_bytes();
  const int64_t pages = L * K * ((n + 15) / 16);
  CHECK(bytes[1] == pages * 16 * ((hd - n_pruned) + hd) * 4);

  // The last decode step attended over the thin keys as keys zeroed in the
  // pruned channels (and its own and the earlier decode keys whole).
  const int64_t step = kDecode, pos0 = n + kDecode - 1;
  for (int64_t l = 0; l < L; ++l) {
    torch::Tensor keys = torch::cat({run.steps()[0][size_t(l)].k, run.steps()[1][size_t(l)].k,
                                     run.steps()[size_t(step)][size_t(l)].k});  // [n + 2, K, hd]
    for (const trace::KeyChannelRow& r : rows)
      if (r.layer == l) keys.narrow(0, 0, n).select(1, r.kv_head).select(1, r.channel).zero_();
    const torch::Tensor want =
        reference_attention(run.steps()[size_t(step)][size_t(l)].q, keys, pos0,
                            run.steps()[size_t(step)][size_t(l)].scale);  // [H, 1, m]
    for (int64_t h = 0; h < K; ++h) {
      const HeadProbs& got = decode_probs[size_t(l)][size_t(h)];
      REQUIRE(int64_t(got.key_pos.size()) == n + kDecode);
      for (int64_t r = 0; r < R; ++r)
        for (size_t i = 0; i < got.key_pos.size(); ++i)
          CHECK(got.probs[r][0][long(i)].item<double>() ==
                Approx(want[h * R + r][0][got.key_pos[i]].item<double>()).margin(1e-6));
    }
  }
}

TEST_CASE("think: after an eviction part it prunes what that part kept", "[policies][think]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t n = int64_t(prompt.size());
  PolicyRun run(*model, "snapkv:budget=20,window=4+think:ratio=0.25,recent=3", n + 2, n);
  run.generate(*model, prompt, 1);
  const cache::RaggedKvCache& cache = run.cache();
  for (int64_t l = 0; l < cache.n_layers(); ++l)
    for (int64_t h = 0; h < cache.n_kv_heads(); ++h) {
      INFO("layer " << l << ", kv head " << h);
      // SnapKV kept 20 prompt entries, its window (the last 4) among them; the
      // last 3 stayed whole, with the decode token.
      CHECK(cache.count(l, h, 1) == 20 - 3);
      CHECK(cache.count(l, h, 0) == 3 + 1);
      CHECK(int64_t(cache.key_channels(l, h).size()) == cache.head_dim() - cache.head_dim() / 4);
    }
}

TEST_CASE("think: bad parameters name the range", "[policies][think]") {
  CHECK_THAT(policy_error("think:ratio=1"), Catch::Contains("think:ratio"));
  CHECK_THAT(policy_error("think:ratio=1"), Catch::Contains("0.99"));
  CHECK_THAT(policy_error("think:window=0"), Catch::Contains("think:window"));
  CHECK_THAT(policy_error("think:recent=-1"), Catch::Contains("think:recent"));
  CHECK(policy_error("think:ratio=0.5,window=16,recent=4").empty());
}

}  // namespace kvscope::test
