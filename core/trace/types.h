// Plain records of the KVScope trace format, version 1 (docs/trace-format.md).
// What the capture engine hands the writer and what the reader hands views:
// no HDF5 types appear here.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::trace {

inline constexpr const char* kFormatName = "kvscope-trace";
inline constexpr int kFormatVersion = 1;  // major: readers refuse other majors
// Minor: additive changes only. 1: /run gate_names; 2: /series; 3: /stalls, /run tier_attended;
// 4: /merges, /rerotations; 5: step kind 2 (context reconstruction), /reconstruction;
// 6: /generation/score; 7: /key_channels; 8: /run kv_dtype, tier_formats;
// 9: /run layer_window, layer_ffn; 10: /interventions, /generation/answer_logprob and
// answer_rank (replays).
inline constexpr int kFormatMinorVersion = 10;
inline constexpr int kOldestReadableVersion = 1;

// A tier index meaning "not in the cache" (from_tier of an admission, to_tier
// of an eviction).
inline constexpr uint8_t kNoTier = 255;

enum class EventKind : uint8_t {
  Admit = 0,    // entry written into the cache (to_tier)
  Reject = 1,   // admission refused: the entry never enters the persistent cache
  Select = 2,   // read-time selection: the entry (or its page) was attended this step
  Evict = 3,    // entry left the cache for good (from_tier)
  Demote = 4,   // moved to a colder tier (from_tier -> to_tier)
  Promote = 5,  // moved to a hotter tier (from_tier -> to_tier)
};
inline constexpr int kEventKindCount = 6;
const char* event_kind_name(EventKind kind);

enum class TokenRole : uint8_t {
  Prompt = 0,     // text the user supplied
  Generated = 1,  // produced by the model during decode
  Needle = 2,     // planted fact of a retrieval task (part of the prompt)
  Template = 3,   // chat-template and special tokens (BOS, <|im_start|>, ...)
  Question = 4,   // the question of a retrieval task (part of the prompt)
};
inline constexpr int kTokenRoleCount = 5;
const char* token_role_name(TokenRole role);

// Reconstruction (minor version 5): a step of a policy's context-reconstruction
// pass (KVzip) after the prefill; it feeds no sequence tokens (n_tokens 0,
// first_token the next sequence token) and its own tokens are the step's rows
// of /reconstruction.
enum class StepKind : uint8_t { Prefill = 0, Decode = 1, Reconstruction = 2 };
const char* step_kind_name(StepKind kind);

struct ModelInfo {
  std::string name;          // e.g. "SmolLM2-135M-Instruct"
  std::string path;          // as given on the command line
  std::string sha256;        // of the weight file (empty when not computed)
  std::string architecture;  // "llama", "qwen2", "qwen3", "gpt2", "qwen3_moe", ...
  std::string dtype = "float32";
  std::string device = "cpu";
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads H
  int64_t n_kv_heads = 0;  // key/value heads K (GQA)
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  // How the cache stored full-precision rows (minor version 8; older traces:
  // "fp32", the only width they had). Last, so positional initialisers of the
  // fields above stay valid.
  std::string kv_dtype = "fp32";
  // Each layer's type (minor version 9; older traces: every layer global and
  // dense). layer_window: its sliding window in tokens, 0 for full (global)
  // attention; layer_ffn: "dense" or "moe" (a routed mixture of experts).
  // Empty when written: every layer global and dense.
  std::vector<int64_t> layer_window;
  std::vector<std::string> layer_ffn;
};

// One line: "global attention" or "sliding window 4096 on 20 of 28 layers
// (0-19)", then "; experts on 3 of 4 layers" where any are MoE.
std::string layer_types_summary(const ModelInfo& m);
// Whether layer `l` attends through a sliding window (false when unrecorded).
inline bool is_window_layer(const ModelInfo& m, int64_t l) {
  return l >= 0 && size_t(l) < m.layer_window.size() && m.layer_window[size_t(l)] > 0;
}

struct GateSpec {
  std::string name;     // group name under /gates, [A-Za-z0-9_-]+
  std::string meaning;  // what the score is
  std::string units = "1";
  double threshold = std::numeric_limits<double>::quiet_NaN();  // NaN: none
  bool time_varying = false;                                    // also record per-step samples
};

// One number per (step, layer, kv head) that a policy records about its own
// state, e.g. KVpop's eviction cutoff: per-token scores belong in /gates, a
// head's running threshold does not (it has no token).
struct SeriesSpec {
  std::string name;     // group name under /series, [A-Za-z0-9_-]+
  std::string meaning;  // what the value is
  std::string units = "1";
};

// Which optional groups a trace holds; decided before capture starts because
// SWMR allows no new datasets once writing has begun.
struct CaptureLayout {
  int64_t max_tokens = 0;    // capacity of the key axis: prompt + max new tokens
  bool received = false;     // /attention/received
  int64_t pooled_block = 0;  // /attention/pooled when > 0 (tokens per block)
  std::vector<std::pair<int32_t, int32_t>> dense_heads;  // (layer, query head)
  int64_t topk = 0;                                      // /attention/topk when > 0
  bool oracle = false;                                   // /oracle
  int64_t oracle_recall_k = 0;
  std::vector<GateSpec> gates;     // /gates/<name>
  std::vector<SeriesSpec> series;  // /series/<name>
};

struct RunInfo {
  ModelInfo model;
  std::string policy;                // full spec as given, e.g. "h2o:heavy=32,recent=32"
  std::string policy_name;           // registry name, e.g. "h2o"
  std::string policy_params_json;    // resolved parameters, defaults included
  std::string budget_kind = "none";  // none | head | layer | global
  int64_t budget = 0;                // entries (per head / per layer / total)
  uint64_t seed = 0;
  std::string prompt;
  std::string capture_levels;  // e.g. "events,received,pooled"
  std::string command_line;
  std::string run_json = "{}";  // everything else (sampling, task, timing, ...)
  std::vector<std::string> tier_names{"hot"};
  // One flag per tier_names entry: 1 the policy's attention reads entries in
  // that tier, 0 it holds them unread until they are promoted (an offloaded
  // tier). Empty: every tier is attended (the writer writes 1s).
  std::vector<uint8_t> tier_attended;
  // One storage format per tier_names entry, as the cache held its rows
  // (minor version 8): "float32", "bfloat16", "float16" or "int4". Empty in
  // older traces (not recorded); the writer writes "float32" for each tier
  // when empty.
  std::vector<std::string> tier_formats;
  std::vector<std::string> reason_names{"none"};
  std::string task_kind;        // e.g. "needle"; empty when the run is no task
  std::string expected_answer;  // what a successful generation contains
  std::string tool_version;     // filled by the writer when empty
  std::string created_utc;      // filled by the writer when empty
};

struct TokenRecord {
  int32_t id = 0;
  int32_t position = 0;
  TokenRole role = TokenRole::Prompt;
  int32_t step = 0;            // forward step that fed this token
  int64_t prompt_offset = -1;  // byte offset into RunInfo::prompt, -1 if none
  std::string text;            // decoded piece (raw bytes, may be partial UTF-8)
};

struct StepRecord {
  StepKind kind = StepKind::Decode;
  int32_t first_token = 0;  // index of the first token fed by this step
  int32_t n_tokens = 0;
  double t_start_s = 0;  // seconds since capture start
  double wall_s = 0;     // forward + policy time of this step
  int64_t entries = 0;   // cache entries held after the step, all heads and tiers
  int64_t kv_bytes = 0;  // bytes held by the cache pool after the step
  // Filled by the writer from the events of the step:
  int64_t event_begin = 0;
  int64_t event_count = 0;
};

struct Event {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  EventKind kind = EventKind::Admit;
  float score = std::numeric_limits<float>::quiet_NaN();
  uint16_t reason = 0;  // index into RunInfo::reason_names
  uint8_t from_tier = kNoTier;
  uint8_t to_tier = kNoTier;
};

// One residence of a token in one tier of one head: [begin_step, end_step).
struct TierInterval {
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  uint8_t tier = 0;
  int32_t begin_step = 0;
  int32_t end_step = -1;  // -1: still there when the trace ended
};

// Attention mass each cached entry received during one step, for one head.
struct ReceivedRow {
  int16_t layer = 0;
  int16_t kv_head = 0;
  std::vector<int32_t> tokens;
  std::vector<float> mass;
};

// One pooled query block of one layer: [H, key_blocks] max and mean, replacing
// whatever was written for that block before (partial blocks are rewritten).
struct PooledRow {
  int16_t layer = 0;
  int32_t query_block = 0;
  std::vector<float> max;   // H * key_blocks
  std::vector<float> mean;  // H * key_blocks
};

// Full attention row of one selected head for one query token.
struct DenseRow {
  int32_t head_index = 0;     // index into CaptureLayout::dense_heads
  int32_t token = 0;          // query token index
  std::vector<float> weight;  // max_tokens (zeros beyond the query)
};

// Top-k attended keys of one query token, all layers and query heads.
struct TopkRow {
  int32_t token = 0;
  std::vector<int32_t> index;  // L * H * k, -1 where fewer than k keys
  std::vector<float> weight;   // L * H * k
};

// One reactive fetch of a cold (not attended) entry that made a step wait.
struct StallRow {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  float wait_s = 0;    // how long the step waited for this entry (modelled or measured)
  int8_t needed = -1;  // oracle: 1 the full cache attended it above the head's 0.9 quantile,
                       // 0 not, -1 no oracle
};

// One entry folded into another on its way out (a merging policy): `token`
// leaves (an evict event of the same step) and its value is blended into the
// value of the entry `into`, which stays, with this weight.
struct MergeRow {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;  // the entry that left
  int32_t into = 0;   // the entry that absorbed it (held by the same head)
  float weight = 0;   // its weight in the absorbing entry's blend (>= 0)
};

// An entry whose cached key was re-rotated to another RoPE position (a policy
// that re-rotates the kept keys to contiguous positions after pruning): its
// token stays the same, its key now carries RoPE position `position`.
struct RerotationRow {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  int32_t position = 0;  // the RoPE position the key now carries
};

// One key channel a head stopped storing (minor version 7; ThinK's query-driven
// key channel pruning): from `step` on, the keys the head moves into a tier
// with pruned channels keep every channel but these.
struct KeyChannelRow {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int16_t channel = 0;  // 0 .. head_dim - 1
};

// One token a context-reconstruction step fed (minor version 5): not a
// sequence token; fed at `position` and gone from the cache after the step.
struct ReconstructionRow {
  int32_t step = 0;
  int32_t position = 0;
  int32_t id = 0;
};

// What an intervention of a replay did to one entry (minor version 10;
// `kvscope replay --intervene`): the policy's loss of it refused (the entry
// moved to the replay's kept tier, attended and unseen by the policy), or the
// entry dropped.
enum class InterventionAction : uint8_t { Kept = 0, Dropped = 1 };
inline constexpr int kInterventionActionCount = 2;
const char* intervention_action_name(InterventionAction action);

struct InterventionRow {
  int32_t step = 0;
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  InterventionAction action = InterventionAction::Kept;
  // The policy's decision it replaced (kept: evict, reject or demote; dropped: evict).
  EventKind decision = EventKind::Evict;
  uint16_t reason = 0;       // that decision's reason (a dropped entry: the drop's own reason)
  int16_t intervention = 0;  // index into /run run_json "interventions"
  float score = std::numeric_limits<float>::quiet_NaN();  // the policy's score of the decision
};

struct GateValue {
  int32_t gate = 0;  // index into CaptureLayout::gates
  int16_t layer = 0;
  int16_t kv_head = 0;
  int32_t token = 0;
  float value = 0;
  bool sample = false;  // also append to the time-varying samples table
};

struct OracleRow {
  float kl = 0;                  // KL(full || policy) of the next-token distribution
  std::vector<float> lost_mass;  // L * H
  std::vector<float> recall;     // L * K
};

// Everything the capture engine learned in one forward step.
struct StepData {
  StepRecord step;
  std::vector<TokenRecord> tokens;  // tokens fed by this step
  std::vector<Event> events;
  std::vector<int32_t> occupancy;   // L * K * R entries per tier after the step
  std::vector<int64_t> tier_bytes;  // R bytes per tier after the step
  std::vector<ReceivedRow> received;
  std::vector<PooledRow> pooled;
  std::vector<DenseRow> dense;
  std::vector<TopkRow> topk;
  std::vector<GateValue> gates;
  // CaptureLayout::series.size() * L * K values, [series][layer][kv head],
  // NaN where the policy recorded none; empty: none at all this step.
  std::vector<float> series;
  std::vector<StallRow> stalls;  // reactive fetches of the step, in the order they happened
  std::vector<MergeRow> merges;  // entries folded into others by the step, in order
  std::vector<RerotationRow> rerotations;         // keys re-rotated by the step, in order
  std::vector<KeyChannelRow> key_channels;        // key channels pruned by the step, in order
  std::vector<ReconstructionRow> reconstruction;  // a reconstruction step's tokens, in order
  std::vector<InterventionRow> interventions;     // decisions a replay's interventions changed
  bool has_oracle = false;
  OracleRow oracle;
  std::string generated_text;  // bytes appended to /generation/text_bytes
};

struct GenerationSummary {
  std::string finish_reason = "length";  // length | eos | stop | error | interrupted
  int8_t success = -1;                   // task success: 1, 0, or -1 when no task
  double score = std::numeric_limits<double>::quiet_NaN();  // share of answers found, NaN: no task
  // The expected answer's log-probability under teacher forcing at the
  // answer step (minor version 10; NaN: not measured) and the rank of its
  // first token there (1: the most likely; -1: not measured).
  double answer_logprob = std::numeric_limits<double>::quiet_NaN();
  int64_t answer_rank = -1;
};

}  // namespace kvscope::trace
