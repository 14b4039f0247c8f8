// libFuzzer target: the trace reader (core/trace/reader.h) and what
// `kvscope info` and the GUI read through it: the summary, windows of steps,
// tokens and events, lifetimes and timelines, occupancy, attention levels,
// gates, series and the oracle. Every read is bounded (small windows at the
// start and the end, as a view shows them); each is tried on its own, as each
// panel handles its own errors. Inputs come through the structure-aware
// HDF5 mutator (trace_mutator.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/analysis/attention_lod.h"
#include "core/analysis/lifetimes.h"
#include "core/analysis/summary.h"
#include "core/analysis/survival.h"
#include "core/trace/reader.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/trace_mutator.h"

namespace {

using kvscope::fuzz::accepts;
using kvscope::trace::TraceReader;

constexpr int64_t kWindow = 32;  // rows a view asks for at once

// [0, min(n, w)) and [max(0, n - w), n): the first and last rows.
template <typename F>
void ends(int64_t n, F&& read) {
  accepts([&] { read(int64_t(0), std::min(n, kWindow)); });
  if (n > kWindow) accepts([&] { read(n - kWindow, n); });
}

void read_heads(const TraceReader& r) {
  const int64_t steps = r.n_steps(), tokens = r.n_tokens();
  const int layers = int(std::min<int64_t>(r.n_layers(), 2));
  const int kv_heads = int(std::min<int64_t>(r.n_kv_heads(), 2));
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < kv_heads; ++k) {
      ends(tokens, [&](int64_t b, int64_t e) { r.lifetimes(l, k, b, e); });
      accepts([&] { r.intervals(l, k); });
      ends(steps, [&](int64_t b, int64_t e) { r.occupancy_series(l, k, b, e); });
      if (r.layout().received) {
        accepts([&] { r.received(0, l, k); });
        accepts([&] { r.received(steps - 1, l, k); });
      }
      for (int g = 0; g < int(std::min<size_t>(r.layout().gates.size(), 2)); ++g)
        ends(tokens, [&](int64_t b, int64_t e) { r.gate_values(g, l, k, b, e); });
      for (int s = 0; s < int(std::min<size_t>(r.series().size(), 2)); ++s)
        ends(steps, [&](int64_t b, int64_t e) { r.series_head(s, l, k, b, e); });
    }
  }
}

void read_attention(const TraceReader& r) {
  namespace an = kvscope::analysis;
  if (r.layout().pooled_block > 0) {
    accepts([&] {
      const int64_t qb = r.pooled_query_blocks(), kb = r.pooled_key_blocks();
      r.pooled(0, 0, 0, std::min<int64_t>(qb, 8), 0, std::min<int64_t>(kb, 8));
      an::attention_view(r, nullptr, 0, 0, 0, std::min<int64_t>(qb, 64), 0,
                         std::min<int64_t>(kb, 64), 16, 16);
    });
  }
  for (int d = 0; d < int(std::min<size_t>(r.layout().dense_heads.size(), 2)); ++d) {
    accepts([&] { r.dense_rows(d, 0, std::min<int64_t>(r.n_tokens(), 4)); });
    accepts([&] { an::dense_view(r, d, 0, kWindow, 0, kWindow, 16, 16); });
  }
  if (r.layout().topk > 0) {
    accepts([&] { r.topk(0); });
    accepts([&] { r.topk(r.n_tokens() - 1); });
  }
}

void read_gates_and_oracle(const TraceReader& r) {
  for (int g = 0; g < int(std::min<size_t>(r.layout().gates.size(), 4)); ++g) {
    accepts([&] {
      const int64_t n = r.gate_sample_count(g);  // 0 for a static gate: no samples table
      if (n > 0) ends(n, [&](int64_t b, int64_t e) { r.gate_samples(g, b, e); });
    });
  }
  for (int s = 0; s < int(std::min<size_t>(r.series().size(), 4)); ++s)
    ends(r.n_steps(), [&](int64_t b, int64_t e) { r.series_values(s, b, e); });
  accepts([&] { r.stalls(); });
  accepts([&] { r.stalls_of_step(r.n_steps() - 1); });
  if (r.layout().oracle) {
    ends(r.n_steps(), [&](int64_t b, int64_t e) { r.oracle_kl(b, e); });
    accepts([&] { r.oracle_lost_mass(0); });
    accepts([&] { r.oracle_recall(r.n_steps() - 1); });
  }
}

void read_timeline(const TraceReader& r) {
  namespace an = kvscope::analysis;
  accepts([&] {
    an::HeadTimeline head = an::HeadTimeline::read(r, 0, 0);
    an::fold_timeline(head, 0, double(head.n_steps), 0, double(head.n_tokens()), 16, 16);
    an::survival(head.lifetimes, head.fed_step, nullptr, 16);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is opened where it lies, as a file image (no file per input).
  std::unique_ptr<TraceReader> reader;
  if (!accepts([&] { reader = TraceReader::open_image("input.kvtrace.h5", data, size); })) return 0;
  kvscope::fuzz::note_trace_opened(data, size);
  const TraceReader& r = *reader;
  // `kvscope info`
  accepts([&] { kvscope::analysis::summarize(r); });
  accepts([&] { r.finish_reason(); });
  accepts([&] { r.task_success(); });
  accepts([&] { r.generated_text(); });
  ends(r.n_steps(), [&](int64_t b, int64_t e) { r.steps(b, e); });
  ends(r.n_tokens(), [&](int64_t b, int64_t e) { r.tokens(b, e); });
  ends(r.n_events(), [&](int64_t b, int64_t e) { r.events(b, e); });
  accepts([&] { r.step_events(0); });
  accepts([&] { r.step_events(r.n_steps() - 1); });
  accepts([&] { r.occupancy(0); });
  ends(r.n_steps(), [&](int64_t b, int64_t e) { r.tier_bytes(b, e); });
  // The GUI's panels
  read_heads(r);
  read_attention(r);
  read_gates_and_oracle(r);
  read_timeline(r);
  return 0;
}
