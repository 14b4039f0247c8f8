#include "core/trace/schema.h"

#include "core/trace/row_tables.h"

#include <cmath>
#include <limits>
#include <sstream>

// The catalogue below is laid out as a table, one dataset per entry:
// clang-format would break the entries into a line per field.
// clang-format off
namespace kvscope::trace {

const char* axis_symbol(Axis axis) {
  switch (axis) {
    case Axis::Steps: return "S";
    case Axis::Tokens: return "T";
    case Axis::TextBytes: return "TB";
    case Axis::ReceivedRows: return "N";
    case Axis::QueryBlocks: return "QB";
    case Axis::GateSamples: return "G";
    case Axis::GenBytes: return "GB";
    case Axis::Layers: return "L";
    case Axis::Heads: return "H";
    case Axis::KvHeads: return "K";
    case Axis::Tiers: return "R";
    case Axis::HeadSlots1: return "L*K+1";
    case Axis::KeyBlocks: return "KB";
    case Axis::DenseHeads: return "D";
    case Axis::Two: return "2";
    case Axis::KeyTokens: return "M";
    case Axis::TopK: return "k";
    case Axis::TableRows: return "rows";
  }
  return "?";
}

bool axis_grows(Axis axis) {
  switch (axis) {
    case Axis::Steps:
    case Axis::Tokens:
    case Axis::TextBytes:
    case Axis::ReceivedRows:
    case Axis::QueryBlocks:
    case Axis::GateSamples:
    case Axis::GenBytes:
    case Axis::TableRows: return true;
    default: return false;
  }
}

const char* feature_name(Feature feature) {
  switch (feature) {
    case Feature::Always: return "always";
    case Feature::Tiered: return "tiers > 1";
    case Feature::Received: return "capture level received";
    case Feature::Pooled: return "capture level pooled";
    case Feature::Dense: return "capture level dense";
    case Feature::TopK: return "capture level topk";
    case Feature::Oracle: return "--oracle";
    case Feature::Gate: return "per gate";
    case Feature::Series:
      return "per series";
  }
  return "?";
}

std::string axis_label(const DatasetSpec& spec, size_t i) {
  const Axis a = spec.dims[i];
  return a == Axis::TableRows ? spec.rows_symbol : axis_symbol(a);
}

int64_t AxisSizes::of(const DatasetSpec& spec, size_t i) const {
  const Axis a = spec.dims[i];
  if (a != Axis::TableRows) return (*this)[a];
  auto it = table_rows.find(spec.table);
  return it == table_rows.end() ? 0 : it->second;
}

namespace {

using A = Axis;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The columns of a row table, as declared in row_tables.cpp.
void add_table(std::vector<DatasetSpec>& c, const RowTableSpec& table) {
  for (const ColumnSpec& column : table.columns) {
    DatasetSpec d{table.path(column), column.elem, {Axis::TableRows}, 0, {table.chunk},
                  column.units, column.meaning, table.feature, column.fill};
    d.since_minor = table.since_minor;
    d.table = table.group;
    d.rows_symbol = table.rows_symbol;
    c.push_back(std::move(d));
  }
}

std::vector<DatasetSpec> build_catalogue() {
  std::vector<DatasetSpec> c;
  auto col = [&](std::string path, Elem e, Axis axis, int64_t chunk, std::string units,
                 std::string meaning, Feature f = Feature::Always, double fill = 0) {
    c.push_back({std::move(path), e, {axis}, 0, {chunk}, std::move(units), std::move(meaning), f,
                 fill});
  };
  // /run
  c.push_back({"/run/complete", Elem::U8, {}, -1, {}, "bool",
               "1 once the writer closed cleanly; 0 while capturing or after a crash",
               Feature::Always, 0});
  // /tokens
  col("/tokens/id", Elem::I32, A::Tokens, 4096, "token id", "vocabulary id of token t");
  col("/tokens/position", Elem::I32, A::Tokens, 4096, "position",
      "RoPE / absolute position of token t (equals t)");
  col("/tokens/role", Elem::U8, A::Tokens, 4096, "enum",
      "0 prompt, 1 generated, 2 needle, 3 template/special, 4 question");
  col("/tokens/step", Elem::I32, A::Tokens, 4096, "step", "forward step that fed token t");
  col("/tokens/text_begin", Elem::I64, A::Tokens, 4096, "byte",
      "offset of token t's decoded piece in /tokens/text_bytes");
  col("/tokens/text_len", Elem::I32, A::Tokens, 4096, "byte",
      "length of token t's decoded piece (raw bytes, may split a UTF-8 character)");
  col("/tokens/prompt_offset", Elem::I64, A::Tokens, 4096, "byte",
      "offset of token t in /run prompt, -1 for generated and template tokens", Feature::Always,
      -1);
  col("/tokens/text_bytes", Elem::U8, A::TextBytes, 65536, "byte",
      "concatenated decoded pieces of all tokens");
  // /steps
  col("/steps/kind", Elem::U8, A::Steps, 4096, "enum", "0 prefill chunk, 1 decode step, 2 context-reconstruction step (from 1.5: feeds "
      "no sequence tokens, n_tokens 0; its tokens are its rows of /reconstruction)");
  col("/steps/first_token", Elem::I32, A::Steps, 4096, "token index",
      "first token fed by the step");
  col("/steps/n_tokens", Elem::I32, A::Steps, 4096, "tokens", "tokens fed by the step");
  col("/steps/t_start_s", Elem::F64, A::Steps, 4096, "s",
      "start of the step, seconds since capture start");
  col("/steps/wall_s", Elem::F64, A::Steps, 4096, "s", "wall time of forward pass and policy");
  col("/steps/entries", Elem::I64, A::Steps, 4096, "entries",
      "cache entries held after the step, summed over layers, heads and tiers");
  col("/steps/kv_bytes", Elem::I64, A::Steps, 4096, "byte",
      "bytes the KV pool really holds after the step");
  col("/steps/event_begin", Elem::I64, A::Steps, 4096, "event row",
      "first row of /events belonging to the step");
  col("/steps/event_count", Elem::I64, A::Steps, 4096, "events", "rows of /events of the step");
  add_table(c, table_of<Event>());
  // /lifetimes
  c.push_back({"/lifetimes/admit_step", Elem::I32, {A::Layers, A::KvHeads, A::Tokens}, 2,
               {1, 1, 4096}, "step",
               "step at which token t entered head (l, k)'s cache, -1 if it never did",
               Feature::Always, -1, false});
  c.push_back({"/lifetimes/evict_step", Elem::I32, {A::Layers, A::KvHeads, A::Tokens}, 2,
               {1, 1, 4096}, "step",
               "step at which token t left head (l, k)'s cache for good, -1 if it never left",
               Feature::Always, -1, false});
  add_table(c, table_of<TierInterval>());
  c.push_back({"/lifetimes/interval_index", Elem::I64, {A::HeadSlots1}, -1, {0}, "interval row",
               "rows of head (l, k) are [index[l*K+k], index[l*K+k+1]) once complete; "
               "-1 in an incomplete trace",
               Feature::Tiered, -1});
  // /occupancy
  c.push_back({"/occupancy/entries", Elem::I32, {A::Steps, A::Layers, A::KvHeads, A::Tiers}, 0,
               {-1, 0, 0, 0}, "entries", "entries head (l, k) holds in tier r after step s",
               Feature::Always, 0});
  c.push_back({"/occupancy/tier_bytes", Elem::I64, {A::Steps, A::Tiers}, 0, {-1, 0}, "byte",
               "bytes the pool holds in tier r after step s", Feature::Always, 0});
  // /gates/<name>
  c.push_back({"/gates/{gate}/value", Elem::F32, {A::Layers, A::KvHeads, A::Tokens}, 2,
               {1, 1, 4096}, "gate units",
               "latest score of token t at head (l, k); NaN where none was given",
               Feature::Gate, kNaN, false});
  col("/gates/{gate}/samples/step", Elem::I32, A::GateSamples, 16384, "step",
      "step the sample was taken", Feature::Gate);
  col("/gates/{gate}/samples/layer", Elem::I16, A::GateSamples, 16384, "layer", "layer",
      Feature::Gate);
  col("/gates/{gate}/samples/kv_head", Elem::I16, A::GateSamples, 16384, "kv head", "kv head",
      Feature::Gate);
  col("/gates/{gate}/samples/token", Elem::I32, A::GateSamples, 16384, "token index", "token",
      Feature::Gate);
  col("/gates/{gate}/samples/value", Elem::F32, A::GateSamples, 16384, "gate units",
      "score at that step", Feature::Gate);
  // /series/<name>: appended with each step, like /occupancy/entries.
  c.push_back({"/series/{series}/value",
               Elem::F32,
               {A::Steps, A::Layers, A::KvHeads},
               0,
               {-1, 0, 0},
               "series units",
               "value the policy recorded for head (l, k) at step s; NaN where it recorded none",
               Feature::Series,
               kNaN});
  // /stalls, /merges, /rerotations, /reconstruction, /key_channels: appended with each step.
  for (const RowTableSpec* table : step_tables()) add_table(c, *table);
  // /attention
  c.push_back({"/attention/received/offset", Elem::I64, {A::Steps, A::Layers, A::KvHeads}, 0,
               {-1, 0, 0}, "row", "first row in token/mass of step s, head (l, k)",
               Feature::Received, 0});
  c.push_back({"/attention/received/count", Elem::I32, {A::Steps, A::Layers, A::KvHeads}, 0,
               {-1, 0, 0}, "rows", "rows in token/mass of step s, head (l, k)", Feature::Received,
               0});
  col("/attention/received/token", Elem::I32, A::ReceivedRows, 65536, "token index",
      "cached token", Feature::Received);
  col("/attention/received/mass", Elem::F32, A::ReceivedRows, 65536, "probability",
      "attention the token received in the step, averaged over the step's queries and the "
      "query heads of the group",
      Feature::Received);
  c.push_back({"/attention/pooled/max", Elem::F16, {A::Layers, A::Heads, A::QueryBlocks,
                A::KeyBlocks}, 2, {1, 1, 64, 64}, "probability",
               "max attention weight over query block x key block (causal pairs only)",
               Feature::Pooled, 0, false});
  c.push_back({"/attention/pooled/mean", Elem::F16, {A::Layers, A::Heads, A::QueryBlocks,
                A::KeyBlocks}, 2, {1, 1, 64, 64}, "probability",
               "mean attention weight over the causal pairs of query block x key block; "
               "keys not held count as 0",
               Feature::Pooled, 0, false});
  c.push_back({"/attention/dense/heads", Elem::I32, {A::DenseHeads, A::Two}, -1, {0, 0},
               "index", "(layer, query head) of each dense head", Feature::Dense, 0});
  c.push_back({"/attention/dense/weight", Elem::F32, {A::DenseHeads, A::Tokens, A::KeyTokens}, 1,
               {1, 16, 0}, "probability",
               "attention row of query token t over key tokens (0 where not attended)",
               Feature::Dense, 0});
  c.push_back({"/attention/topk/index", Elem::I32, {A::Tokens, A::Layers, A::Heads, A::TopK}, 0,
               {-1, 0, 0, 0}, "token index", "top-k attended keys of query token t, -1 padding",
               Feature::TopK, -1});
  c.push_back({"/attention/topk/weight", Elem::F32, {A::Tokens, A::Layers, A::Heads, A::TopK},
               0, {-1, 0, 0, 0}, "probability", "their attention weights", Feature::TopK, 0});
  // /oracle
  col("/oracle/kl", Elem::F32, A::Steps, 4096, "nat",
      "KL(full || policy) of the next-token distributions at step s", Feature::Oracle);
  c.push_back({"/oracle/lost_mass", Elem::F32, {A::Steps, A::Layers, A::Heads}, 0, {-1, 0, 0},
               "probability",
               "attention the full-cache query puts on entries the policy no longer holds",
               Feature::Oracle, 0});
  c.push_back({"/oracle/recall", Elem::F32, {A::Steps, A::Layers, A::KvHeads}, 0, {-1, 0, 0},
               "fraction",
               "share of the full cache's top-k attended entries the policy still holds",
               Feature::Oracle, 0});
  // /generation
  col("/generation/text_bytes", Elem::U8, A::GenBytes, 16384, "byte", "generated text (UTF-8)");
  c.push_back({"/generation/finish_reason", Elem::U8, {}, -1, {}, "enum",
               "0 unknown (capture did not finish), 1 length, 2 eos, 3 stop string, 4 error, "
               "5 interrupted",
               Feature::Always, 0});
  c.push_back({"/generation/success", Elem::I8, {}, -1, {}, "enum",
               "task success: 1 yes, 0 no, -1 when the run is no task or did not finish",
               Feature::Always, -1});
  // Minor version 6: the task's score, which is finer than success for
  // multi-answer tasks (RULER scores the share of answers found).
  c.push_back({"/generation/score", Elem::F64, {}, -1, {}, "fraction",
               "task score: share of the expected answers the generation contains (RULER's "
               "string_match_all; 1 exactly when success is 1), NaN when the run is no task or "
               "did not finish",
               Feature::Always, std::numeric_limits<double>::quiet_NaN()});
  c.back().since_minor = 6;
  // Minor version 10: the continuous effect a replay measures (kvscope why
  // --causal), finer than success and score.
  c.push_back({"/generation/answer_logprob", Elem::F64, {}, -1, {}, "nats",
               "log-probability of the expected answer's tokens under teacher forcing at the "
               "answer step, over the cache as the prompt left it; NaN when not measured",
               Feature::Always, std::numeric_limits<double>::quiet_NaN()});
  c.back().since_minor = 10;
  c.push_back({"/generation/answer_rank", Elem::I64, {}, -1, {}, "rank",
               "rank of the expected answer's first token at the answer step (1: the most "
               "likely); -1 when not measured",
               Feature::Always, -1});
  c.back().since_minor = 10;
  return c;
}

}  // namespace

const std::vector<DatasetSpec>& dataset_catalogue() {
  static const std::vector<DatasetSpec> catalogue = build_catalogue();
  return catalogue;
}

std::vector<DatasetSpec> datasets_for(const CaptureLayout& layout, int64_t n_tiers,
                                      int64_t minor_version) {
  std::vector<DatasetSpec> out;
  for (const DatasetSpec& spec : dataset_catalogue()) {
    if (spec.since_minor > minor_version) continue;
    switch (spec.feature) {
      case Feature::Always: out.push_back(spec); break;
      case Feature::Tiered:
        if (n_tiers > 1) out.push_back(spec);
        break;
      case Feature::Received:
        if (layout.received) out.push_back(spec);
        break;
      case Feature::Pooled:
        if (layout.pooled_block > 0) out.push_back(spec);
        break;
      case Feature::Dense:
        if (!layout.dense_heads.empty()) out.push_back(spec);
        break;
      case Feature::TopK:
        if (layout.topk > 0) out.push_back(spec);
        break;
      case Feature::Oracle:
        if (layout.oracle) out.push_back(spec);
        break;
      case Feature::Gate:
        for (const GateSpec& gate : layout.gates) {
          DatasetSpec g = spec;
          g.path.replace(g.path.find("{gate}"), 6, gate.name);
          if (g.path.find("/samples/") != std::string::npos && !gate.time_varying) continue;
          out.push_back(std::move(g));
        }
        break;
      case Feature::Series:
        for (const SeriesSpec& series : layout.series) {
          DatasetSpec d = spec;
          d.path.replace(d.path.find("{series}"), 8, series.name);
          out.push_back(std::move(d));
        }
        break;
    }
  }
  return out;
}

namespace {
GroupSpec group_of(const RowTableSpec& table) {
  return {table.group, table.meaning, table.since_minor};
}
}  // namespace

const std::vector<GroupSpec>& group_catalogue() {
  static const std::vector<GroupSpec> groups = [] {
    std::vector<GroupSpec> g = {
      {"/run", "what was captured: model, policy, budget, seed, prompt, tool version"},
      {"/tokens", "one row per token fed to the model, prompt then generated"},
      {"/steps", "one row per forward step: prefill chunks, then decode steps"},
      group_of(table_of<Event>()),
      {"/lifetimes", "per (layer, kv head, token): when it entered and left the cache"},
      group_of(table_of<TierInterval>()),
      {"/occupancy", "per step and (layer, kv head): entries per tier, and pool bytes"},
      {"/gates", "learned or heuristic per-token scores, one subgroup per gate"},
      {"/series", "per-step policy values per (layer, kv head), one subgroup per series"},
    };
    for (const RowTableSpec* table : step_tables()) g.push_back(group_of(*table));
    g.insert(g.end(), {
      {"/attention", "attention statistics, as the capture levels asked"},
      {"/attention/received", "attention mass each cached entry received per step (CSR)"},
      {"/attention/pooled", "block-pooled attention maps per layer and query head"},
      {"/attention/dense", "full attention rows for chosen heads"},
      {"/attention/topk", "top-k attended keys per query token"},
      {"/oracle", "full-cache shadow run teacher-forced on the same tokens"},
      {"/generation", "generated text, finish reason and task success"},
    });
    return g;
  }();
  return groups;
}

const std::vector<AttributeSpec>& attribute_catalogue() {
  static const std::vector<AttributeSpec> attrs = {
      {"/", "format", "string", "always \"kvscope-trace\""},
      {"/", "version", "int64", "format major version (this document: 1)"},
      {"/", "minor_version", "int64", "additive revisions within a major version"},
      {"/", "writer", "string", "\"kvscope <version>\""},
      {"/", "created_utc", "string", "ISO 8601 creation time"},
      {"/run", "model_name", "string", "model name"},
      {"/run", "model_path", "string", "weights path as given"},
      {"/run", "model_sha256", "string", "SHA-256 of the weight file, or empty"},
      {"/run", "architecture", "string", "llama, mistral, qwen2, qwen3, phi3, gpt2, mixtral, qwen3_moe, olmoe"},
      {"/run", "dtype", "string", "compute dtype"},
      {"/run", "kv_dtype", "string",
       "how the KV cache stored full-precision rows: fp32, bf16 or fp16 (minor version 8; "
       "absent before: fp32)"},
      {"/run", "device", "string", "cpu or cuda"},
      {"/run", "n_layers", "int64", "L"},
      {"/run", "n_heads", "int64", "H, query heads per layer"},
      {"/run", "n_kv_heads", "int64", "K, key/value heads per layer"},
      {"/run", "head_dim", "int64", "head dimension"},
      {"/run", "vocab_size", "int64",
       "vocabulary size, plus the ids of a policy's inserted tokens (RestoreKV's restore "
       "tokens: vocab_size - n .. vocab_size - 1)"},
      {"/run", "context_length", "int64", "trained context length"},
      {"/run", "layer_window", "int64[]",
       "L sliding windows in tokens, 0 for full (global) attention (minor version 9; absent "
       "before: every layer global)"},
      {"/run", "layer_ffn", "string[]",
       "L FFN kinds: dense or moe, a routed mixture of experts (minor version 9; absent before: "
       "dense)"},
      {"/run", "max_tokens", "int64", "M, capacity of the token axis (prompt + max new)"},
      {"/run", "policy", "string", "policy spec as given, e.g. h2o:heavy=32,recent=32"},
      {"/run", "policy_name", "string", "registry name of the policy"},
      {"/run", "policy_params", "string", "JSON of resolved parameters, defaults included"},
      {"/run", "budget_kind", "string", "none, head, layer or global"},
      {"/run", "budget", "int64", "entries per head, per layer or in total"},
      {"/run", "seed", "int64", "sampling seed"},
      {"/run", "prompt", "string", "prompt text"},
      {"/run", "capture_levels", "string", "what /attention holds"},
      {"/run", "command_line", "string", "the command that made the trace"},
      {"/run", "run_json", "string", "everything else as JSON (sampling, task, ...)"},
      {"/run", "tier_names", "string[]", "R names; tier r of /events and /occupancy"},
      {"/run", "reason_names", "string[]", "names of /events/reason values"},
      {"/run", "tier_attended", "uint8[]",
       "R flags: 1 the attention reads entries of tier r, 0 they are held unread until promoted "
       "(minor version 3; absent before: every tier attended)"},
      {"/run", "tier_formats", "string[]",
       "R storage formats, one per tier: float32, bfloat16, float16 or int4 (minor version 8; "
       "absent before)"},
      {"/run", "gate_names", "string[]",
       "names of the /gates groups the policy declared (minor version 1; absent before)"},
      {"/run", "tool_version", "string", "KVScope version"},
      {"/run", "task_kind", "string", "task of the run (e.g. needle), or empty"},
      {"/run", "expected_answer", "string",
       "answer a successful generation contains (several: each, joined by \", \")"},
      {"/gates", "order", "string[]", "gate names in index order (GateValue::gate)"},
      {"/gates/<name>", "meaning, units", "string", "what the score is and its units"},
      {"/gates/<name>", "threshold", "float64", "decision threshold, NaN when none"},
      {"/gates/<name>", "time_varying", "int64", "1 when samples/ holds per-step values"},
      {"/series", "order", "string[]",
       "series names in index order (minor version 2; the group exists only when the policy "
       "declared a series)"},
      {"/series/<name>", "meaning, units", "string", "what the value is and its units"},
      {"/attention/pooled", "block, key_blocks", "int64", "tokens per block; KB"},
      {"/attention/topk", "k", "int64", "entries per query and head"},
      {"/oracle", "recall_k", "int64", "k of the oracle top-k recall"},
  };
  return attrs;
}

AxisSizes fixed_axis_sizes(const ModelInfo& model, const CaptureLayout& layout, int64_t n_tiers) {
  AxisSizes s;
  s[Axis::Layers] = model.n_layers;
  s[Axis::Heads] = model.n_heads;
  s[Axis::KvHeads] = model.n_kv_heads;
  s[Axis::Tiers] = n_tiers;
  s[Axis::HeadSlots1] = model.n_layers * model.n_kv_heads + 1;
  s[Axis::KeyBlocks] = layout.pooled_block > 0
                           ? (layout.max_tokens + layout.pooled_block - 1) / layout.pooled_block
                           : 0;
  s[Axis::DenseHeads] = static_cast<int64_t>(layout.dense_heads.size());
  s[Axis::Two] = 2;
  s[Axis::KeyTokens] = layout.max_tokens;
  s[Axis::TopK] = layout.topk;
  return s;
}

namespace {
const char* elem_label(Elem e) {
  switch (e) {
    case Elem::U8: return "uint8";
    case Elem::I8: return "int8";
    case Elem::U16: return "uint16";
    case Elem::I16: return "int16";
    case Elem::I32: return "int32";
    case Elem::I64: return "int64";
    case Elem::F16: return "float16";
    case Elem::F32: return "float32";
    case Elem::F64: return "float64";
  }
  return "?";
}
}  // namespace

std::string schema_markdown() {
  std::ostringstream md;
  md << "| group | meaning |\n|---|---|\n";
  for (const GroupSpec& g : group_catalogue()) md << "| `" << g.path << "` | " << g.meaning << " |\n";
  md << "\n| object | attribute | type | meaning |\n|---|---|---|---|\n";
  for (const AttributeSpec& a : attribute_catalogue())
    md << "| `" << a.object << "` | `" << a.name << "` | " << a.type << " | " << a.meaning
       << " |\n";
  md << "\n| dataset | type | shape | grows along | storage | units | present | meaning |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const DatasetSpec& d : dataset_catalogue()) {
    std::string shape = "[";
    for (size_t i = 0; i < d.dims.size(); ++i)
      shape += std::string(i ? ", " : "") + axis_label(d, i);
    shape += "]";
    if (d.dims.empty()) shape = "scalar";
    std::string grows = d.append_axis >= 0 ? axis_label(d, size_t(d.append_axis)) : "—";
    std::string storage = d.dims.empty() ? "scalar" : d.compress ? "deflate" : "raw, rewritten in place";
    md << "| `" << d.path << "` | " << elem_label(d.elem) << " | " << shape << " | " << grows
       << " | " << storage << " | " << d.units << " | " << feature_name(d.feature)
       << (d.since_minor > 0 ? " from 1." + std::to_string(d.since_minor) : std::string()) << " | "
       << d.meaning << " |\n";
  }
  return md.str();
}

}  // namespace kvscope::trace
// clang-format on
