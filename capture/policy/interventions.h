// Interventions on a replay (`kvscope replay --intervene SPEC`): a
// cache-level activation patching. The step driver applies them to the
// policy's decisions through policy::Decisions, so every policy is patched
// the same way without knowing it:
//   restore:heads=L.H,...|layers=A-B|all[,from=STEP]
//       what the policy evicts, rejects or demotes to an unread tier in those
//       heads (from STEP on) stays, in the replay's own "kept" tier: attended,
//       invisible to the policy, not counted against its budget;
//   pin:tokens=needle|question|A-B[,heads=...]
//       those tokens stay the same way, whatever the policy decides;
//   drop:tokens=...[,heads=...][,at=STEP]
//       those tokens leave those heads (all by default) as soon as the layer
//       has attended them, from STEP on (on the full cache: which heads does
//       the answer need?);
//   only:heads=...|layers=A-B
//       the policy acts only there: everything it would take elsewhere stays.
// Heads are L.H (one kv head), L or L.* (a layer's kv heads), A-B (layers A
// to B) or all; tokens are needle, question, a token index N or A-B
// (inclusive); a list continues over commas ("heads=1.0,2.3,from=4").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::policy {

enum class InterventionKind : uint8_t { Restore = 0, Pin = 1, Drop = 2, Only = 3 };
const char* intervention_kind_name(InterventionKind kind);

// What an intervention is resolved against: the shape of the trace it
// replays and its tokens' roles.
struct InterventionShape {
  int64_t layers = 0, kv_heads = 0;
  int64_t tokens = 0;                     // token indices 0 .. tokens - 1 exist
  int64_t steps = 0;                      // steps 0 .. steps - 1 exist
  std::vector<int32_t> needle, question;  // token indices with those roles, ascending
};

struct Intervention {
  InterventionKind kind = InterventionKind::Restore;
  std::string text;                 // the spec as given
  std::vector<uint8_t> heads;       // [L * K]: 1 where it applies
  std::vector<uint8_t> tokens;      // [tokens]: 1 where it applies; empty: every token
  std::vector<int32_t> token_list;  // the same, ascending (empty: every token)
  int64_t from_step = 0;            // restore / pin / only: from this step on; drop: at
  int64_t n_heads() const;
  bool covers(int64_t layer, int64_t kv_head, int64_t kv_heads) const {
    return heads[size_t(layer * kv_heads + kv_head)] != 0;
  }
  bool covers_token(int64_t token) const {
    return tokens.empty() || (token < int64_t(tokens.size()) && tokens[size_t(token)] != 0);
  }
};

// Throws InputError (field --intervene, naming the spec part and the range
// the trace allows) for anything the shape does not have.
Intervention parse_intervention(const std::string& spec, const InterventionShape& shape);

// A head list as the specs write it: "all", "L.H", "L", "L.*", "A-B", joined by ','.
std::string head_list_text(const std::vector<uint8_t>& heads, int64_t kv_heads);

class Interventions {
 public:
  Interventions(std::vector<Intervention> list, int64_t layers, int64_t kv_heads);

  bool empty() const { return list_.empty(); }
  const std::vector<Intervention>& list() const { return list_; }
  // Whether any restore, pin or only keeps what the policy takes at
  // (step, layer, kv head, token); *which: the first that does.
  bool keeps(int64_t step, int64_t layer, int64_t kv_head, int64_t token, int* which) const;
  // Whether the replay needs the kept tier (some restore, pin or only).
  bool keeps_any() const;
  // Whether any drop applies at (step, layer, kv head) (its tokens: list()[i].token_list).
  bool drops_at(int64_t step, int64_t layer, int64_t kv_head) const;
  int64_t kv_heads() const { return K_; }

 private:
  std::vector<Intervention> list_;
  int64_t L_, K_;
};

}  // namespace kvscope::policy
