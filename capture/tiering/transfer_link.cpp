#include "capture/tiering/transfer_link.h"

#include <algorithm>
#include <cmath>

namespace kvscope::tiering {

double TransferLink::copy_seconds(int64_t bytes) const {
  return spec_.latency_us * 1e-6 + double(bytes) / (spec_.bandwidth_gbps * 1e9);
}

int64_t TransferLink::prefetch(int64_t step, double phase, int64_t bytes) {
  const double offset = phase * spec_.step_us * 1e-6;
  busy_until_ = std::max(busy_until_, step_start(step) + offset) + copy_seconds(bytes);
  // The first later step whose attention at `phase` comes after the copy's end.
  int64_t land = step + 1;
  while (step_start(land) + offset < busy_until_) ++land;
  return land;
}

double TransferLink::fetch_now(int64_t step, double phase, int64_t bytes) {
  const double now = step_start(step) + phase * spec_.step_us * 1e-6;
  const double done = std::max(busy_until_, now) + copy_seconds(bytes);
  busy_until_ = done;
  const double wait = done - now;
  stalled_ += wait;
  return wait;
}

}  // namespace kvscope::tiering
