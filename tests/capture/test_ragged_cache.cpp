// The ragged cache against a masked dense oracle: random keep patterns
// (rejections at admission, evictions from any position, moves to an INT4
// warm tier that is read and a cold tier that is not), prefill chunks and
// decode steps. The oracle keeps every key and value and masks what the
// policy's decisions say is gone; the cache must give the same attention
// within fp32 tolerance, hold exactly the entries the decisions leave, never
// read an entry after it left, and hold exactly the pages its entries need.
#include "tests/capture/capture_test_util.h"

#include <map>
#include <random>
#include <set>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/policy/policy.h"
#include "kernels/quant_int4.h"

using namespace kvscope;

namespace {

// What the policy decided, in order, so the test can replay it.
struct Decision {
  enum Kind { Admit, Reject, Evict, Move } kind;
  int64_t layer, head, pos;
  int tier;
};

class RandomPolicy : public policy::Policy {
 public:
  RandomPolicy(uint64_t seed, bool tiers) : rng_(seed), tiered_(tiers) {}
  std::vector<cache::TierSpec> tiers() const override {
    if (!tiered_) return policy::Policy::tiers();
    return {{"hot", cache::RowFormat::F32, true},
            {"warm", cache::RowFormat::Int4, true},
            {"cold", cache::RowFormat::F32, false}};
  }
  std::vector<std::string> reason_names() const override { return {"new token", "random"}; }

  void admit(policy::AdmitContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h)
      for (int64_t i = 0; i < c.n; ++i) {
        policy::Admission& a = c.at(h, i);
        a.reject = coin(0.15);
        a.tier = (tiered_ && coin(0.2)) ? 1 : 0;
        log.push_back({a.reject ? Decision::Reject : Decision::Admit, c.layer, h, c.pos0 + i,
                       a.reject ? 0 : a.tier});
      }
  }
  void after_attention(policy::LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      std::vector<int64_t> held;
      for (int64_t t = 0; t < c.cache.n_tiers(); ++t)
        for (int32_t p : c.cache.positions(c.layer, h, t)) held.push_back(p);
      std::sort(held.begin(), held.end());
      for (int64_t p : held) {
        if (coin(0.12)) {
          c.decide.evict(c.layer, h, p, 0.0f, 1);
          log.push_back({Decision::Evict, c.layer, h, p, -1});
        } else if (tiered_ && coin(0.2)) {
          int to = int(rng_() % 3);
          if (to == c.cache.tier_of(c.layer, h, p)) continue;
          c.decide.move(c.layer, h, p, to, 0.0f, 1);
          log.push_back({Decision::Move, c.layer, h, p, to});
        }
      }
    }
  }
  std::vector<Decision> log;

 private:
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  std::mt19937_64 rng_;
  bool tiered_;
};

// The masked dense oracle: every key and value ever written, and which tier
// (if any) each position is in according to the replayed decisions.
struct Oracle {
  int64_t K, R, hd;
  cache::RowFormat full = cache::RowFormat::F32;          // how full-precision tiers store rows
  std::vector<std::vector<std::map<int64_t, int>>> held;  // [layer][kv head]: pos -> tier
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<torch::Tensor, torch::Tensor>> kv;

  // What a float32 value reads back as from a full-precision row.
  torch::Tensor stored(const torch::Tensor& x) const {
    if (full == cache::RowFormat::F32) return x;
    return x.to(full == cache::RowFormat::BF16 ? torch::kBFloat16 : torch::kHalf)
        .to(torch::kFloat32);
  }

  torch::Tensor value_as_read(const torch::Tensor& x_in, int tier) const {
    // Every written value is rounded to the cache's width first (the policy
    // sees, and the INT4 tier quantises, the stored value).
    const torch::Tensor x = stored(x_in);
    if (tier != 1) return x;  // warm entries are read back from INT4
    std::vector<uint8_t> codes(size_t(kernels::int4_code_bytes(hd)));
    std::vector<float> params(size_t(kernels::int4_groups(hd) * 2));
    torch::Tensor out = torch::empty({hd});
    kernels::quantize_int4(x.contiguous().data_ptr<float>(), 1, hd, codes.data(), params.data());
    kernels::dequantize_int4(codes.data(), params.data(), 1, hd, out.data_ptr<float>());
    return out;
  }

  // Attention of the step's queries over held attended entries plus the new tokens.
  torch::Tensor attend(const model::AttentionInputs& in,
                       const std::vector<cache::TierSpec>& tiers) {
    const int64_t n = in.q.size(0);
    torch::Tensor out = torch::zeros({n, K * R, hd}, torch::kFloat64);
    for (int64_t h = 0; h < K; ++h) {
      std::vector<int64_t> pos;
      std::vector<torch::Tensor> ks, vs;
      for (auto [p, tier] : held[size_t(in.layer)][size_t(h)]) {
        if (!tiers[size_t(tier)].attended) continue;
        auto& e = kv.at({in.layer, h, p});
        pos.push_back(p);
        ks.push_back(value_as_read(e.first, tier));
        vs.push_back(value_as_read(e.second, tier));
      }
      for (int64_t i = 0; i < n; ++i) {
        if (held[size_t(in.layer)][size_t(h)].count(in.pos0 + i)) continue;
        pos.push_back(in.pos0 + i);
        ks.push_back(stored(in.k[i][h]));
        vs.push_back(stored(in.v[i][h]));
      }
      torch::Tensor Kt = torch::stack(ks).to(torch::kFloat64),
                    Vt = torch::stack(vs).to(torch::kFloat64);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < n; ++i) {
          torch::Tensor s = torch::mv(Kt, in.q[i][h * R + r].to(torch::kFloat64)) * in.scale;
          for (size_t j = 0; j < pos.size(); ++j)
            if (pos[j] > in.pos0 + i) s[int64_t(j)] = -INFINITY;
          out[i][h * R + r] = torch::mv(Vt.t(), torch::softmax(s, 0));
        }
    }
    return out;
  }

  void apply(const Decision& d, const model::AttentionInputs* in) {
    auto& m = held[size_t(d.layer)][size_t(d.head)];
    switch (d.kind) {
      case Decision::Admit:
        m[d.pos] = d.tier;
        kv[{d.layer, d.head, d.pos}] = {in->k[d.pos - in->pos0][d.head].clone(),
                                        in->v[d.pos - in->pos0][d.head].clone()};
        break;
      case Decision::Reject: break;
      case Decision::Evict: m.erase(d.pos); break;
      case Decision::Move: {
        // A move re-reads the entry: a warm entry moves on as its INT4 value.
        auto& e = kv.at({d.layer, d.head, d.pos});
        e = {value_as_read(e.first, m[d.pos]), value_as_read(e.second, m[d.pos])};
        m[d.pos] = d.tier;
        break;
      }
    }
  }
};

class KeyWatcher : public cache::FullMatrixObserver {
 public:
  bool wants_probs(int64_t) const override { return true; }
  void on_attention(int64_t layer, int64_t kv_head, const float* probs, int64_t R, int64_t n,
                    int64_t m, const int64_t* key_pos, int64_t) override {
    seen.clear();
    for (int64_t j = 0; j < m; ++j) seen.insert(key_pos[j]);
    double total = 0;
    for (int64_t j = 0; j < R * n * m; ++j) total += probs[j];
    rows_sum = total / double(R * n);
    last_layer = layer;
    last_head = kv_head;
  }
  std::set<int64_t> seen;
  double rows_sum = 0;
  int64_t last_layer = -1, last_head = -1;
};

void run_random(uint64_t seed, bool tiered, cache::RowFormat full = cache::RowFormat::F32) {
  const model::ModelConfig c = test::small_config();
  RandomPolicy policy(seed, tiered);
  const int64_t M = 200, prompt = 40, page = 16;
  policy.setup({&c, M, prompt, page});
  policy::StepDriver driver(c, {page, M, prompt, full}, policy, "test");
  const cache::RaggedKvCache& cache = driver.cache();
  Oracle oracle{c.n_kv_heads, c.n_heads / c.n_kv_heads, c.head_dim, full, {}, {}};
  oracle.held.assign(size_t(c.n_layers), std::vector<std::map<int64_t, int>>(size_t(c.n_kv_heads)));
  std::vector<std::pair<int64_t, int64_t>> steps = {{0, 16}, {16, 16}, {32, 8}};
  for (int64_t p = 40; p < 120; ++p) steps.push_back({p, 1});
  double worst = 0;
  for (auto [pos0, n] : steps) {
    driver.begin_step(pos0, n);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      model::AttentionInputs in = test::random_inputs(c, l, pos0, n, seed);
      size_t before = policy.log.size();
      torch::Tensor want;
      torch::Tensor got;
      {
        // Admission decisions come first inside attend(); replay them into
        // the oracle before computing its attention, then the rest after.
        got = driver.attend(in);
      }
      size_t admitted_end = before;
      while (admitted_end < policy.log.size() &&
             (policy.log[admitted_end].kind == Decision::Admit ||
              policy.log[admitted_end].kind == Decision::Reject))
        ++admitted_end;
      // Entries admitted this step are visible to the step's queries in
      // their new tier; replay admissions, attend, then the layer's evictions.
      for (size_t i = before; i < admitted_end; ++i) oracle.apply(policy.log[i], &in);
      want = oracle.attend(in, cache.tiers());
      for (size_t i = admitted_end; i < policy.log.size(); ++i) oracle.apply(policy.log[i], &in);
      double diff = (got.to(torch::kFloat64) - want).abs().max().item<double>();
      worst = std::max(worst, diff);
      REQUIRE(diff < 1e-5);
    }
    driver.end_step();
    driver.take_events();
    // The cache holds exactly what the decisions leave, in the right tiers,
    // and exactly the pages those entries need.
    int64_t pages = 0;
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        const auto& want = oracle.held[size_t(l)][size_t(h)];
        REQUIRE(cache.count(l, h) == static_cast<int64_t>(want.size()));
        for (auto [p, tier] : want) REQUIRE(cache.tier_of(l, h, p) == tier);
        for (int64_t t = 0; t < cache.n_tiers(); ++t)
          pages += (cache.count(l, h, t) + page - 1) / page;
      }
    int64_t page_bytes_f32 = 2 * page * c.head_dim * 4;
    int64_t expected_bytes = 0;
    for (int64_t t = 0; t < cache.n_tiers(); ++t) {
      int64_t tier_pages = 0;
      for (int64_t l = 0; l < c.n_layers; ++l)
        for (int64_t h = 0; h < c.n_kv_heads; ++h)
          tier_pages += (cache.count(l, h, t) + page - 1) / page;
      const cache::RowFormat f = cache.tiers()[size_t(t)].format;
      REQUIRE((f == cache::RowFormat::Int4) == (tiered && t == 1));  // F32 tiers stored at `full`
      int64_t row = f == cache::RowFormat::Int4 ? kernels::int4_code_bytes(c.head_dim) +
                                                      kernels::int4_groups(c.head_dim) * 8
                                                : c.head_dim * (f == cache::RowFormat::F32 ? 4 : 2);
      if (f != cache::RowFormat::Int4) REQUIRE(f == full);
      expected_bytes += tier_pages * 2 * page * row;
    }
    REQUIRE(cache.bytes_in_use() == expected_bytes);
    (void)page_bytes_f32;
    (void)pages;
  }
  INFO("largest difference " << worst);
  CHECK(worst < 1e-5);
}

}  // namespace

TEST_CASE("ragged attention equals the masked dense oracle for random keep patterns", "[cache]") {
  torch::InferenceMode guard;
  for (uint64_t seed : {1, 2, 3}) run_random(seed, false);
}

TEST_CASE("ragged attention with INT4 warm and unread cold tiers equals the oracle", "[cache]") {
  torch::InferenceMode guard;
  for (uint64_t seed : {4, 5}) run_random(seed, true);
}

TEST_CASE("a bf16 or fp16 cache equals the oracle over the values it stores, at half the bytes",
          "[cache]") {
  torch::InferenceMode guard;
  for (cache::RowFormat full : {cache::RowFormat::BF16, cache::RowFormat::F16}) {
    run_random(6, false, full);
    run_random(7, true, full);
  }
}

TEST_CASE("an evicted entry is never read again", "[cache]") {
  torch::InferenceMode guard;
  const model::ModelConfig c = test::small_config();
  RandomPolicy policy(9, true);
  policy.setup({&c, 100, 20, 16});
  policy::StepDriver driver(c, {16, 100, 20}, policy, "test");
  const cache::RaggedKvCache& cache = driver.cache();
  KeyWatcher watcher;
  driver.set_observer(&watcher);
  std::set<std::pair<int64_t, int64_t>> gone;  // (layer*K + head, pos)
  driver.begin_step(0, 20);
  for (int64_t l = 0; l < c.n_layers; ++l) driver.attend(test::random_inputs(c, l, 0, 20, 9));
  driver.end_step();
  for (int64_t pos = 20; pos < 90; ++pos) {
    for (const trace::Event& e : driver.take_events())
      if (e.kind == trace::EventKind::Evict || e.kind == trace::EventKind::Reject)
        gone.insert({e.layer * c.n_kv_heads + e.kv_head, e.token});
    driver.begin_step(pos, 1);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      // Read every head of the layer: the watcher sees the last head's keys.
      driver.attend(test::random_inputs(c, l, pos, 1, 9));
      for (int64_t p : watcher.seen)
        REQUIRE(gone.count({l * c.n_kv_heads + watcher.last_head, p}) == 0);
      REQUIRE(std::abs(watcher.rows_sum - 1.0) < 1e-4);  // weights still sum to 1 per query
    }
    driver.end_step();
  }
  CHECK_FALSE(gone.empty());
}

TEST_CASE("memory is really released when heads shrink", "[cache]") {
  torch::InferenceMode guard;
  const model::ModelConfig c = test::small_config();
  policy::Policy keep_all;
  const int64_t M = 2048;
  keep_all.setup({&c, M, M, 16});
  policy::StepDriver driver(c, {16, M, M}, keep_all, "test");
  const cache::RaggedKvCache& cache = driver.cache();
  driver.begin_step(0, M);
  for (int64_t l = 0; l < c.n_layers; ++l) driver.attend(test::random_inputs(c, l, 0, M, 3));
  driver.end_step();
  const int64_t full = cache.bytes_reserved();
  CHECK(cache.bytes_in_use() == c.n_layers * c.n_kv_heads * (M / 16) * 2 * 16 * c.head_dim * 4);
  // Evict all but 16 entries of every head: the pool compacts at end_step.
  driver.begin_step(M - 1, 0);
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h)
      for (int64_t p = 0; p < M - 16; ++p) driver.storage().remove(l, h, p);
  driver.end_step();
  CHECK(cache.bytes_in_use() == c.n_layers * c.n_kv_heads * 1 * 2 * 16 * c.head_dim * 4);
  CHECK(cache.bytes_reserved() <= full / 8);
  // What is left is still read correctly after the compaction moved pages.
  std::vector<float> k(size_t(c.head_dim)), v(size_t(c.head_dim));
  cache.read_entry(1, 1, M - 1, k.data(), v.data());
  model::AttentionInputs in = test::random_inputs(c, 1, 0, M, 3);
  CHECK(torch::equal(torch::from_blob(k.data(), {c.head_dim}), in.k[M - 1][1]));
}
