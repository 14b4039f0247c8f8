// CPU kernels against plain references: the segment decode kernel (what the
// ragged cache reads pages with) equals the BLAS multi-query path on the same
// keys however the rows are cut into segments, with windows and masks; INT4
// group quantisation stays within half a step of the input.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "kernels/attention.h"
#include "kernels/cpu/float_loops.h"
#include "kernels/parallel.h"
#include "kernels/quant_int4.h"

using namespace kvscope::kernels;

TEST_CASE("decode segments equal the multi-query path for any cut into segments", "[kernels]") {
  torch::manual_seed(7);
  std::mt19937 rng(7);
  for (int64_t m : {1, 5, 16, 37, 300}) {
    for (int64_t window : {0, 8}) {
      const int64_t R = 3, hd = 64;
      torch::Tensor q = torch::randn({R, 1, hd}), k = torch::randn({m, hd}),
                    v = torch::randn({m, hd});
      // Positions in a shuffled order with gaps, as a ragged head holds them.
      std::vector<int64_t> pos(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = 3 * i;
      std::shuffle(pos.begin(), pos.end(), rng);
      const int64_t q_pos = 3 * m;
      torch::Tensor probs_ref;
      torch::Tensor ref =
          attention_multi(q, k, v, torch::tensor(pos), q_pos, 0.125, window, &probs_ref);
      std::vector<Segment> segs;
      for (int64_t r = 0; r < m;) {
        int64_t len = std::min<int64_t>(m - r, 1 + int64_t(rng() % 17));
        segs.push_back({k.data_ptr<float>() + r * hd, v.data_ptr<float>() + r * hd, len, hd});
        r += len;
      }
      torch::Tensor out = torch::empty({R, hd});
      std::vector<float> probs(static_cast<size_t>(R * m));
      if (window > 0 && m > 0 && 3 * (m - 1) <= q_pos - window) {
        // every key outside the window: both paths must agree on "nothing visible"
      }
      attention_decode_segments(q.data_ptr<float>(), R, hd, segs, pos.data(), q_pos, 0.125, window,
                                out.data_ptr<float>(), probs.data());
      INFO("m=" << m << " window=" << window);
      torch::Tensor ref_out = ref.reshape({R, hd});
      if (ref_out.isnan().any().item<bool>()) {
        // No visible key: the decode kernel returns zeros rather than NaN.
        CHECK(out.abs().max().item<float>() == 0.0f);
        continue;
      }
      CHECK((out - ref_out).abs().max().item<float>() < 1e-5f);
      CHECK((torch::from_blob(probs.data(), {R, m}) - probs_ref.reshape({R, m}))
                .abs()
                .max()
                .item<float>() < 1e-6f);
    }
  }
}

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rows of k and v cut into segments of random lengths, empty ones included.
std::vector<Segment> random_cut(const torch::Tensor& k, const torch::Tensor& v, std::mt19937& rng) {
  const int64_t m = k.size(0), hd = k.size(1);
  std::vector<Segment> segs;
  for (int64_t r = 0; r < m;) {
    const int64_t len = std::min<int64_t>(m - r, int64_t(rng() % 300));  // 0: an empty page
    segs.push_back({k.data_ptr<float>() + r * hd, v.data_ptr<float>() + r * hd, len, hd});
    r += len;
  }
  return segs;
}

}  // namespace

TEST_CASE("decode splits keys into chunks whose combination is exact softmax attention",
          "[kernels]") {
  // 1500 keys: six chunks combined (max, sum and value rescaling), against a
  // float64 softmax; with a window that empties the first chunks entirely.
  torch::manual_seed(23);
  std::mt19937 rng(23);
  const int64_t R = 3, hd = 64, m = 1500;
  torch::Tensor q = torch::randn({R, hd}) * 2, k = torch::randn({m, hd}), v = torch::randn({m, hd});
  std::vector<int64_t> pos(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = i;
  for (int64_t window : {0, 700}) {
    torch::Tensor s = torch::matmul(q.to(torch::kFloat64), k.to(torch::kFloat64).t()) * 0.125;
    if (window > 0) s.narrow(1, 0, m - window + 1).fill_(-std::numeric_limits<double>::infinity());
    torch::Tensor p_ref = torch::softmax(s, -1);
    torch::Tensor out_ref = torch::matmul(p_ref, v.to(torch::kFloat64));
    std::vector<float> out(size_t(R * hd)), probs(size_t(R * m));
    attention_decode_segments(q.data_ptr<float>(), R, hd, random_cut(k, v, rng), pos.data(), m,
                              0.125, window, out.data(), probs.data());
    INFO("window " << window);
    const torch::Tensor o = torch::from_blob(out.data(), {R, hd}).to(torch::kFloat64);
    const torch::Tensor p = torch::from_blob(probs.data(), {R, m}).to(torch::kFloat64);
    CHECK((o - out_ref).abs().max().item<double>() < 1e-5);
    CHECK((p - p_ref).abs().max().item<double>() < 1e-6);
    if (window > 0) CHECK(p.narrow(1, 0, m - window + 1).abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("decode gives the same bits for any thread count, cut into segments or head batch",
          "[kernels]") {
  torch::manual_seed(29);
  std::mt19937 rng(29);
  const int64_t K = 3, R = 2, hd = 64, m = 2100;
  torch::Tensor q = torch::randn({K, R, hd}), k = torch::randn({K, m, hd}),
                v = torch::randn({K, m, hd});
  std::vector<int64_t> pos(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = i;
  // Reference: one call per head, one segment per head, on the calling thread.
  set_kernel_threads(1);
  std::vector<float> out_ref(size_t(K * R * hd)), probs_ref(size_t(K * R * m));
  for (int64_t h = 0; h < K; ++h) {
    const std::vector<Segment> one{{k[h].data_ptr<float>(), v[h].data_ptr<float>(), m, hd}};
    attention_decode_segments(q[h].data_ptr<float>(), R, hd, one, pos.data(), m, 0.125, 0,
                              out_ref.data() + h * R * hd, probs_ref.data() + h * R * m);
  }
  for (int threads : {1, 2, 3}) {
    set_kernel_threads(threads);
    std::vector<std::vector<Segment>> segs;
    for (int64_t h = 0; h < K; ++h) segs.push_back(random_cut(k[h], v[h], rng));
    std::vector<float> out(out_ref.size()), probs(probs_ref.size());
    std::vector<DecodeHead> heads;
    for (int64_t h = 0; h < K; ++h)
      heads.push_back({q[h].data_ptr<float>(), &segs[size_t(h)], pos.data(),
                       out.data() + h * R * hd, probs.data() + h * R * m});
    attention_decode_heads(heads.data(), K, R, hd, m, 0.125, 0);
    INFO(threads << " threads");
    CHECK(same_bits(out, out_ref));
    CHECK(same_bits(probs, probs_ref));
  }
  set_kernel_threads(1);
}

TEST_CASE("prefill gives the same bits for any thread count", "[kernels]") {
  torch::manual_seed(31);
  const int64_t R = 3, hd = 32, n = 300, m = 340;
  torch::Tensor q = torch::randn({R, n, hd}), k = torch::randn({m, hd}), v = torch::randn({m, hd});
  torch::Tensor pos = torch::arange(m, torch::kInt64);
  torch::Tensor probs1, probs2;
  set_kernel_threads(1);
  torch::Tensor out1 = attention_multi(q, k, v, pos, m - n, 0.2, 90, &probs1);
  set_kernel_threads(2);
  torch::Tensor out2 = attention_multi(q, k, v, pos, m - n, 0.2, 90, &probs2);
  set_kernel_threads(1);
  CHECK(torch::equal(out1, out2));
  CHECK(torch::equal(probs1, probs2));
}

TEST_CASE("prefill of a layer's kv heads in one split equals head by head, bit for bit",
          "[kernels]") {
  torch::manual_seed(37);
  const int64_t K = 3, R = 2, hd = 32, n = 330, m = 400;
  std::vector<torch::Tensor> q, k, v;
  for (int64_t h = 0; h < K; ++h) {
    q.push_back(torch::randn({R, n, hd}));
    k.push_back(torch::randn({m, hd}));
    v.push_back(torch::randn({m, hd}));
  }
  torch::Tensor pos = torch::arange(m, torch::kInt64);
  for (int64_t window : {0, 100}) {
    set_kernel_threads(1);
    std::vector<torch::Tensor> want;
    for (int64_t h = 0; h < K; ++h)
      want.push_back(attention_multi(q[size_t(h)], k[size_t(h)], v[size_t(h)], pos, m - n, 0.2,
                                     window, nullptr));
    set_kernel_threads(2);  // (head, block) items, one BLAS thread each where OpenBLAS is
    const std::vector<torch::Tensor> got = attention_multi_heads(q, k, v, pos, m - n, 0.2, window);
    set_kernel_threads(1);
    INFO("window " << window);
    REQUIRE(got.size() == size_t(K));
    for (int64_t h = 0; h < K; ++h) CHECK(torch::equal(got[size_t(h)], want[size_t(h)]));
  }
}

TEST_CASE("the vectorised exp is exp to a float's rounding on the scores' range", "[kernels]") {
  float worst = 0.0f;
  for (float x = -87.0f; x <= 0.0f; x += 0.001f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, float(std::abs(cpu::exp_nonpositive(x) - want) / want));
  }
  CHECK(worst < 4e-7f);
  CHECK(cpu::exp_nonpositive(0.0f) == 1.0f);
  CHECK(cpu::exp_nonpositive(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(cpu::exp_nonpositive(-1000.0f) < 1e-37f);  // clamped below: weight ~0, not garbage
  CHECK(cpu::max8(nullptr, 0) == -std::numeric_limits<float>::infinity());
  std::vector<float> x{3, -1, 7.5f, 2, 0, 7, -9, 1, 4, 7.25f, 8, -2};  // 8 lanes + a tail
  CHECK(cpu::max8(x.data(), int64_t(x.size())) == 8.0f);
  CHECK(cpu::max8(x.data(), 8) == 7.5f);
}

TEST_CASE("kernel threads run every item once, nest serially and pass errors on", "[kernels]") {
  set_kernel_threads(2);
  REQUIRE(kernel_threads() == 2);
  std::vector<std::atomic<int>> runs(1000);
  parallel_items(1000, [&](int64_t i) {
    runs[size_t(i)].fetch_add(1);
    // A nested call runs on this thread, all of it.
    int inner = 0;
    parallel_items(3, [&](int64_t) { ++inner; });
    if (inner != 3) runs[size_t(i)].fetch_add(100);
  });
  CHECK(std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& r) { return r == 1; }));
  CHECK_THROWS_WITH(parallel_items(50,
                                   [](int64_t i) {
                                     if (i == 7) throw std::runtime_error("item 7 failed");
                                   }),
                    "item 7 failed");
  std::atomic<int> after{0};
  parallel_items(64, [&](int64_t) { after.fetch_add(1); });  // the pool still works
  CHECK(after == 64);
  set_kernel_threads(1);
}

TEST_CASE("kernel threads run items under the caller's LibTorch modes, job after job",
          "[kernels]") {
  // Tensors made under InferenceMode may only be written under it: a worker
  // that ran items without the caller's state would throw. Many short jobs
  // in a row also give workers that wake after their job has ended.
  set_kernel_threads(2);
  c10::InferenceMode guard;
  torch::Tensor t = torch::zeros({2, 4});
  std::atomic<int> outside{0};  // Catch's assertions are not thread-safe
  for (int job = 0; job < 2000; ++job)
    parallel_items(2, [&](int64_t i) {
      if (!c10::InferenceMode::is_enabled()) outside.fetch_add(1);
      t[i].add_(1);
    });
  CHECK(outside == 0);
  CHECK(t.eq(2000).all().item<bool>());
  set_kernel_threads(1);
}

TEST_CASE("the multi-query path is causal by position and honours the selection mask",
          "[kernels]") {
  torch::manual_seed(3);
  const int64_t R = 2, n = 4, hd = 16, m = 10;
  torch::Tensor q = torch::randn({R, n, hd}), k = torch::randn({m, hd}), v = torch::randn({m, hd});
  torch::Tensor pos = torch::arange(m, torch::kInt64);
  torch::Tensor allowed = torch::ones({n, m}, torch::kBool);
  allowed[2][1] = false;
  torch::Tensor probs;
  attention_multi(q, k, v, pos, 6, 0.25, 0, &probs, &allowed);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      bool visible = j <= 6 + i && !(i == 2 && j == 1);
      if (!visible)
        CHECK(probs[0][i][j].item<float>() == 0.0f);
      else
        CHECK(probs[0][i][j].item<float>() > 0.0f);
    }
  CHECK((probs.sum(-1) - 1).abs().max().item<float>() < 1e-5f);
}

TEST_CASE("a long prefill in query blocks equals plain causal attention", "[kernels]") {
  // n > 64 takes the blocked path (each block multiplies only the keys it
  // can see); a plain float64 softmax over the masked square is the reference,
  // with keys before the chunk (a cached prefix), a window and a selection mask.
  torch::manual_seed(11);
  const int64_t R = 3, hd = 32, prefix = 40, n = 600, m = prefix + n;
  torch::Tensor q = torch::randn({R, n, hd}), k = torch::randn({m, hd}), v = torch::randn({m, hd});
  torch::Tensor pos = torch::arange(m, torch::kInt64);
  torch::Tensor allowed = torch::rand({n, m}) > 0.1;
  allowed.diagonal(prefix).fill_(true);  // every query sees itself
  for (int64_t window : {0, 100}) {
    for (bool with_mask : {false, true}) {
      torch::Tensor probs;
      torch::Tensor out = attention_multi(q, k, v, pos, prefix, 0.2, window, &probs,
                                          with_mask ? &allowed : nullptr);
      torch::Tensor qp = torch::arange(prefix, prefix + n, torch::kInt64).unsqueeze(1);
      torch::Tensor visible = pos.unsqueeze(0) <= qp;
      if (window > 0) visible = visible.logical_and(pos.unsqueeze(0) > qp - window);
      if (with_mask) visible = visible.logical_and(allowed);
      torch::Tensor s = torch::matmul(q.to(torch::kFloat64), k.to(torch::kFloat64).t()) * 0.2;
      s = s.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
      torch::Tensor p = torch::softmax(s, -1);
      torch::Tensor ref = torch::matmul(p, v.to(torch::kFloat64));
      INFO("window " << window << " mask " << with_mask);
      CHECK((out.to(torch::kFloat64) - ref).abs().max().item<double>() < 1e-5);
      CHECK((probs.to(torch::kFloat64) - p).abs().max().item<double>() < 1e-6);
    }
  }
}

TEST_CASE("the block sink sees every weight once, as the whole matrix has it", "[kernels]") {
  // Blocks assembled into [R, n, m] (zeros outside each block) must equal the
  // probs output: for the blocked path (keys in order, a window, a mask) and
  // for the dense path (keys out of order).
  torch::manual_seed(17);
  const int64_t R = 2, hd = 16, n = 600, m = 650;
  torch::Tensor q = torch::randn({R, n, hd}), k = torch::randn({m, hd}), v = torch::randn({m, hd});
  torch::Tensor allowed = torch::rand({n, m}) > 0.2;
  allowed.diagonal(m - n).fill_(true);
  for (bool shuffled : {false, true}) {
    torch::Tensor pos = torch::arange(m, torch::kInt64);
    if (shuffled) pos = pos.flip(0);
    std::vector<float> assembled(size_t(R * n * m), 0.0f);
    std::vector<int> seen(size_t(n), 0);
    int64_t blocks = 0;
    const BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
      ++blocks;
      for (int64_t i = 0; i < b; ++i) ++seen[size_t(i0 + i)];
      for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < b; ++i)
          for (int64_t j = 0; j < mk; ++j)
            assembled[size_t((r * n + i0 + i) * m + k0 + j)] = p[(r * b + i) * mk + j];
    };
    torch::Tensor probs;
    torch::Tensor out = attention_multi(q, k, v, pos, m - n, 0.25, 200, &probs, &allowed, &sink);
    INFO("keys " << (shuffled ? "out of order" : "in order"));
    CHECK(blocks == (shuffled ? 1 : 10));  // 600 queries: 9 blocks of 64, then 24
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    torch::Tensor got = torch::from_blob(assembled.data(), {R, n, m});
    CHECK(torch::equal(got, probs));
    CHECK(probs.sum(-1).sub(1).abs().max().item<float>() < 1e-5f);
  }
}

TEST_CASE("a query that sees no key gets what a dense softmax gives", "[kernels]") {
  // Keys at 0..9 and 30..39; the query at 20 with a window of 5 sees none of
  // them (the older ones are out of the window, the newer ones in its future).
  torch::manual_seed(19);
  const int64_t R = 2, hd = 8;
  torch::Tensor q = torch::randn({R, 1, hd}), k = torch::randn({20, hd}),
                v = torch::randn({20, hd});
  torch::Tensor pos = torch::cat({torch::arange(0, 10), torch::arange(30, 40)}).to(torch::kInt64);
  torch::Tensor probs;
  torch::Tensor out = attention_multi(q, k, v, pos, 20, 0.5, 5, &probs);
  CHECK(torch::isnan(probs).all().item<bool>());
  CHECK(torch::isnan(out).all().item<bool>());
}

TEST_CASE("sum_rows_add adds each column summed top to bottom, bit for bit", "[kernels]") {
  torch::manual_seed(13);
  const int64_t rows = 37, cols = 101;
  torch::Tensor p = torch::rand({rows, cols});
  std::vector<float> out(static_cast<size_t>(cols), -1.0f);
  sum_rows_add(p.data_ptr<float>(), rows, cols, out.data());
  const float* d = p.data_ptr<float>();
  for (int64_t j = 0; j < cols; ++j) {
    float s = -1.0f;
    for (int64_t r = 0; r < rows; ++r) s += d[r * cols + j];
    CHECK(out[size_t(j)] == s);
  }
}

TEST_CASE("INT4 group quantisation stays within half a step", "[kernels]") {
  torch::manual_seed(5);
  // 64: two groups of 32; 8 (stories260K's heads): the row is one group.
  for (int64_t hd : {int64_t(64), int64_t(8)}) {
    const int64_t rows = 50, gs = int4_group_size(hd);
    CHECK(gs == (hd == 64 ? 32 : 8));
    torch::Tensor x = torch::randn({rows, hd}) * 3;
    std::vector<uint8_t> codes(static_cast<size_t>(rows * int4_code_bytes(hd)));
    std::vector<float> params(static_cast<size_t>(rows * int4_groups(hd) * 2));
    quantize_int4(x.data_ptr<float>(), rows, hd, codes.data(), params.data());
    torch::Tensor y = torch::empty({rows, hd});
    dequantize_int4(codes.data(), params.data(), rows, hd, y.data_ptr<float>());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < int4_groups(hd); ++g) {
        float scale = params[size_t((r * int4_groups(hd) + g) * 2)];
        torch::Tensor err = (x[r].narrow(0, g * gs, gs) - y[r].narrow(0, g * gs, gs)).abs();
        REQUIRE(scale > 0);
        REQUIRE(err.max().item<float>() <= scale / 2 + 1e-6f);
      }
  }
  const int64_t hd = 64;
  std::vector<uint8_t> codes(static_cast<size_t>(int4_code_bytes(hd)));
  std::vector<float> params(static_cast<size_t>(int4_groups(hd) * 2));
  // Values on the grid come back exactly; a constant group has scale 0.
  std::vector<float> grid(static_cast<size_t>(hd));
  for (int64_t i = 0; i < hd; ++i) grid[size_t(i)] = -1.0f + float(i % 16) * 0.25f;
  std::fill(grid.begin() + 32, grid.end(), 2.5f);
  quantize_int4(grid.data(), 1, hd, codes.data(), params.data());
  std::vector<float> back(static_cast<size_t>(hd));
  dequantize_int4(codes.data(), params.data(), 1, hd, back.data());
  for (int64_t i = 0; i < hd; ++i) CHECK(back[size_t(i)] == grid[size_t(i)]);
  CHECK(params[2] == 0.0f);
}

TEST_CASE("decode reads bf16 and fp16 rows as their float32 widening, bit for bit", "[kernels]") {
  // A 16-bit cache (--kv-dtype) is read in place and widened as read: the
  // same bits as the kernel over float32 copies of the stored values, for
  // every head_dim path (64, 128 fixed at compile time; any other), with
  // pages of both widths mixed in one head (a float32 INT4 scratch beside
  // bf16 pages).
  torch::manual_seed(41);
  std::mt19937 rng(41);
  for (const auto& [dtype, type] :
       {std::pair{torch::kBFloat16, RowType::BF16}, std::pair{torch::kHalf, RowType::F16}}) {
    for (int64_t hd : {64, 128, 40}) {
      const int64_t R = 3, m = 700;
      const torch::Tensor q = torch::randn({R, hd});
      const torch::Tensor k16 = torch::randn({m, hd}).to(dtype),
                          v16 = torch::randn({m, hd}).to(dtype);
      const torch::Tensor k32 = k16.to(torch::kFloat32), v32 = v16.to(torch::kFloat32);
      std::vector<int64_t> pos(static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) pos[size_t(i)] = 2 * i;
      std::shuffle(pos.begin(), pos.end(), rng);
      std::vector<float> out_ref(size_t(R * hd)), probs_ref(size_t(R * m));
      attention_decode_segments(q.data_ptr<float>(), R, hd,
                                {{k32.data_ptr(), v32.data_ptr(), m, hd}}, pos.data(), 2 * m, 0.125,
                                0, out_ref.data(), probs_ref.data());
      std::vector<Segment> segs;
      for (int64_t r = 0, i = 0; r < m; ++i) {
        const int64_t len = std::min<int64_t>(m - r, 1 + int64_t(rng() % 40));
        const bool wide = i % 3 == 2;  // every third page float32
        const torch::Tensor& k = wide ? k32 : k16;
        const torch::Tensor& v = wide ? v32 : v16;
        const int64_t bytes = r * hd * k.element_size();
        segs.push_back({static_cast<const char*>(k.data_ptr()) + bytes,
                        static_cast<const char*>(v.data_ptr()) + bytes, len, hd,
                        wide ? RowType::F32 : type});
        r += len;
      }
      std::vector<float> out(out_ref.size()), probs(probs_ref.size());
      attention_decode_segments(q.data_ptr<float>(), R, hd, segs, pos.data(), 2 * m, 0.125, 0,
                                out.data(), probs.data());
      INFO(torch::toString(dtype) << " head_dim " << hd);
      CHECK(same_bits(out, out_ref));
      CHECK(same_bits(probs, probs_ref));
    }
  }
}
