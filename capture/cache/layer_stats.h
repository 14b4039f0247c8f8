// Attention statistics of one layer's attention, computed once by the cache
// from the post-softmax weights and shared by every reader (policies, the
// recorder). Indexed [kv_head][position]; only positions the head attended
// this step are meaningful (others hold 0).
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope::cache {

// What the policy asks the cache to compute.
struct StatsNeeds {
  bool received = false;           // mean weight over the step's queries and the group's heads
  bool last_query = false;         // mean weight over the group's heads of the step's last query
  int64_t observation_window = 0;  // prefill: summed weight of the last w prompt queries
  // Largest weight over the step's queries and the group's heads (KVzip's
  // score; renormalised in reconstruction steps, policy::ReconstructionChunk).
  bool peak = false;
  // KVzip+: the peak kept per query head ([H][M], head g at g = kv_head * R + r)
  // and each query's weights divided by the norm of its normalised layer
  // input ||h_i|| first.
  bool peak_per_query_head = false;
  bool peak_over_hidden_norm = false;
  // The received mass kept per query head too: the mean over the step's
  // queries of each head's weight ([H][M]; KVCompose with task=mean, group=max;
  // reconstruction steps only, as peak).
  bool received_per_query_head = false;
  // The step's inputs a policy reads besides k and v (AdmitContext::in and
  // the other contexts'): the queries, the layer's normalised input, the
  // keys before RoPE. The step driver hands a policy only these (the others
  // undefined), so on a GPU no unread tensor is copied to the host, and a
  // policy that reads one it did not declare fails on the CPU as on a GPU.
  bool query = false, hidden = false, key_pre_rope = false;
  // What a policy that reads one of those inputs and no statistic declares:
  // StatsNeeds::reading(&StatsNeeds::query).
  static StatsNeeds reading(bool StatsNeeds::*input) {
    StatsNeeds n;
    n.*input = true;
    return n;
  }
  // The layer's input is read by the policy or by KVzip+'s norms.
  bool reads_hidden() const { return hidden || peak_over_hidden_norm; }
  // Attention statistics (not inputs) wanted.
  bool any() const {
    return received || last_query || observation_window > 0 || peak || received_per_query_head;
  }
};

struct LayerStats {
  int64_t max_tokens = 0;
  std::vector<std::vector<float>> received;    // [K][M]
  std::vector<std::vector<float>> last_query;  // [K][M]
  // Accumulated over the prefill steps that contain observation-window
  // queries (summed over those queries, mean over the group's heads).
  std::vector<std::vector<float>> window;  // [K][M]
  int64_t window_queries = 0;              // queries summed into `window` so far
  // [K][M] when StatsNeeds::peak ([H][M] with peak_per_query_head), else empty
  std::vector<std::vector<float>> peak;
  // [H][M] when StatsNeeds::received_per_query_head (head g at kv_head * R + r), else empty
  std::vector<std::vector<float>> received_by_query_head;

  void resize(int64_t kv_heads, int64_t M) {
    max_tokens = M;
    received.assign(size_t(kv_heads), std::vector<float>(size_t(M), 0.0f));
    last_query.assign(size_t(kv_heads), std::vector<float>(size_t(M), 0.0f));
    window.assign(size_t(kv_heads), std::vector<float>(size_t(M), 0.0f));
  }
};

}  // namespace kvscope::cache
