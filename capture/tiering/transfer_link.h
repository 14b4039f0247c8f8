// The link between the attended tiers and the cold tier (T2) of a tiered
// cache, as a latency/bandwidth model on a virtual clock: a copy of b bytes
// takes latency + b / bandwidth, copies queue on the one link, and a decode
// step lasts `step_seconds` of compute plus whatever it stalled. A
// speculative prefetch overlaps compute and lands at the first step that
// starts after it finished; a reactive fetch makes the step wait. Used by
// the CPU build, where T2 is a separate allocation and no copy crosses a bus
// (the trace's /run says "modelled"). Defaults: PCIe 4.0 x16 with pinned
// host memory (docs/policies/sfc.md, "Transfer model").
#pragma once

#include <cstdint>

namespace kvscope::tiering {

struct LinkSpec {
  double bandwidth_gbps = 25.0;  // GB/s achieved host -> device (31.5 theoretical)
  double latency_us = 10.0;      // per copy: launch + DMA setup
  double step_us = 1000.0;       // compute time of one step that prefetches overlap
};

class TransferLink {
 public:
  explicit TransferLink(const LinkSpec& spec) : spec_(spec) {}

  const LinkSpec& spec() const { return spec_; }
  // Seconds one copy of `bytes` occupies the link.
  double copy_seconds(int64_t bytes) const;
  // The virtual time step `step` starts (the steps before it and their stalls).
  double step_start(int64_t step) const { return double(step) * spec_.step_us * 1e-6 + stalled_; }

  // `phase` in [0, 1): where in a step the caller's layer attends (layer /
  // layers): a layer's copies are issued after its attention in one step and
  // needed by its attention in a later one.
  //
  // Issues a prefetch of `bytes` during step `step`; returns the first step
  // whose attention at `phase` can read it (> step).
  int64_t prefetch(int64_t step, double phase, int64_t bytes);
  // A synchronous fetch of `bytes` before the attention at `phase` of step
  // `step`: it waits for the link to drain and for the copy; returns the wait.
  double fetch_now(int64_t step, double phase, int64_t bytes);

  double stalled_seconds() const { return stalled_; }

 private:
  LinkSpec spec_;
  double busy_until_ = 0;  // the link's queue drains at this virtual time
  double stalled_ = 0;     // total wait added to the clock
};

}  // namespace kvscope::tiering
