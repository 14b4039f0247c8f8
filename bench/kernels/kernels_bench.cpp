// Decode attention: the segment kernel (what the ragged cache runs) against
// LibTorch's bmm over a contiguous cache (the anchor), same shapes, same run.
// Prefill attention: attention_multi (causal query blocks) against one
// LibTorch mm + additive causal mask + softmax + mm over the full square, and
// with its weights streamed to a received-mass sink (what capture levels add).
// usage: bench_kernels [threads]  (split as the engine's --threads splits them)
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "capture/generate/engine.h"
#include "kernels/attention.h"

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One kv head's prefill attention over n = m tokens, best of 3.
void prefill(int threads) {
  const int64_t R = 3, hd = 64;
  for (int64_t n : {512, 2048, 4096}) {
    torch::Tensor q = torch::randn({R, n, hd}), k = torch::randn({n, hd}),
                  v = torch::randn({n, hd});
    torch::Tensor pos = torch::arange(n, torch::kInt64);
    torch::Tensor causal = torch::ones({n, n}).tril().log();  // 0 visible, -inf hidden
    double t_ref = 1e30, t_multi = 1e30, t_sink = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      torch::Tensor s = torch::mm(q.reshape({R * n, hd}), k.t()) * 0.125;
      torch::Tensor p = torch::softmax((s.view({R, n, n}) + causal).view({R * n, n}), -1);
      torch::Tensor ref = torch::mm(p, v);
      t_ref = std::min(t_ref, seconds_since(t0));
      auto t1 = Clock::now();
      kvscope::kernels::attention_multi(q, k, v, pos, 0, 0.125, 0, nullptr);
      t_multi = std::min(t_multi, seconds_since(t1));
      // What `--capture received` costs: the weights streamed to a sink that
      // sums the mass each key receives (the recorder's reduction).
      std::vector<float> mass(static_cast<size_t>(n), 0.0f);
      const kvscope::kernels::BlockSink received = [&](const float* p, int64_t b, int64_t mk,
                                                       int64_t, int64_t k0) {
        kvscope::kernels::sum_rows_add(p, R * b, mk, mass.data() + k0);
      };
      auto t2 = Clock::now();
      kvscope::kernels::attention_multi(q, k, v, pos, 0, 0.125, 0, nullptr, nullptr, &received);
      t_sink = std::min(t_sink, seconds_since(t2));
    }
    const double causal_flop = 2.0 * 2.0 * double(R) * double(hd) * double(n) * double(n + 1) / 2;
    std::printf(
        "prefill attention, %d threads, R=%lld hd=%lld, %5lld tokens: full square %.1f ms, "
        "attention_multi %.1f ms (%.2fx, %.0f causal GFLOP/s), with received sink %.1f ms\n",
        threads, (long long)R, (long long)hd, (long long)n, t_ref * 1e3, t_multi * 1e3,
        t_ref / t_multi, causal_flop / t_multi / 1e9, t_sink * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  kvscope::generate::set_threads(threads);         // as the engine's --threads
  const int64_t K = 3, R = 3, hd = 64, page = 16;  // SmolLM2-135M attention shapes
  for (int64_t m : {256, 1024, 4096}) {
    torch::Tensor q = torch::randn({K, R, hd});
    torch::Tensor k = torch::randn({K, m, hd}), v = torch::randn({K, m, hd});
    torch::Tensor pos = torch::arange(m, torch::kInt64);
    const int iters = 2000;
    // Anchor: bmm + softmax + bmm over the contiguous cache.
    torch::Tensor out;
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      torch::Tensor s = torch::bmm(q, k.transpose(1, 2)) * 0.125;
      out = torch::bmm(torch::softmax(s, -1), v);
    }
    double t_bmm = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    // Segment kernel over 16-row pages.
    std::vector<float> o(size_t(R * hd)), probs(size_t(R * m));
    auto t1 = Clock::now();
    for (int i = 0; i < iters; ++i)
      for (int64_t h = 0; h < K; ++h) {
        std::vector<kvscope::kernels::Segment> segs;
        const float* kb = k[h].data_ptr<float>();
        const float* vb = v[h].data_ptr<float>();
        for (int64_t r = 0; r < m; r += page)
          segs.push_back({kb + r * hd, vb + r * hd, std::min(page, m - r), hd});
        kvscope::kernels::attention_decode_segments(q[h].data_ptr<float>(), R, hd, segs,
                                                    pos.data_ptr<int64_t>(), m, 0.125, 0, o.data(),
                                                    probs.data());
      }
    double t_seg = std::chrono::duration<double>(Clock::now() - t1).count() / iters;
    std::printf(
        "decode attention, %d threads, K=%lld R=%lld hd=%lld, %5lld keys: bmm %.1f us, paged "
        "kernel %.1f us (%.2fx)\n",
        threads, (long long)K, (long long)R, (long long)hd, (long long)m, t_bmm * 1e6, t_seg * 1e6,
        t_seg / t_bmm);
  }
  prefill(threads);
  return 0;
}
