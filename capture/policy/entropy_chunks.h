// kvpress EntropyGatedChunkKVPress's selection (an extension of ChunkKV): a
// chunk whose importance comes from one spiky token keeps only its best few
// tokens, and the budget saved goes to further chunks. docs/policies/composition.md
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope::policy {

// Which of T entries (position order; scores summed over the layer's heads)
// stay, keeping `budget` of them: chunks of `chunk` in order of their mean
// score, each whole, except a chunk at or above the median chunk score whose
// normalised score entropy is below the median entropy keeps only its top
// `low` entries; leftover budget goes to the best remaining entries.
std::vector<char> entropy_gated_chunks(const std::vector<float>& scores, int64_t chunk,
                                       int64_t low, int64_t budget);

}  // namespace kvscope::policy
