// `--capture LEVELS`: what a capture records besides the always-recorded
// events, lifetimes, occupancy, tokens, steps and generation.
//   none            run the policy, write no trace (the overhead baseline)
//   events          the always-recorded groups only
//   received        attention mass each cached entry receives, every step
//   pooled[:B]      block-pooled attention maps (B tokens per block, default 16)
//   dense:L.H,...   full attention rows of query head H of layer L
//   topk:K          the K most attended keys of every query and head
// Levels combine with '+' or ',' between them, e.g. "received+pooled:32+topk:8".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::recorder {

struct CaptureLevels {
  bool none = false;
  bool received = false;
  int64_t pooled_block = 0;
  std::vector<std::pair<int32_t, int32_t>> dense;  // (layer, query head)
  int64_t topk = 0;
  std::string text;  // normalised spelling for /run capture_levels
};

// Throws InputError naming --capture and the offending item.
CaptureLevels parse_capture_levels(const std::string& spec, int64_t n_layers, int64_t n_heads);

}  // namespace kvscope::recorder
