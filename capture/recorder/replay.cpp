#include "capture/recorder/replay.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "kvscope_version.h"

namespace kvscope::recorder {

namespace {

using nlohmann::json;

json run_json_of(const trace::TraceReader& r) {
  try {
    return json::parse(r.run().run_json);
  } catch (const json::exception& e) {
    throw InputError(r.path(), "/run run_json", std::string("is not JSON: ") + e.what());
  }
}

// The recorded value of run_json "replay" key `key`, refusing a trace without it.
template <typename T>
T replay_field(const trace::TraceReader& r, const json& replay, const char* key) {
  if (!replay.contains(key))
    throw InputError(r.path(), std::string("/run run_json replay.") + key,
                     "absent (expected the capture's setting; recapture with this KVScope)");
  try {
    return replay.at(key).get<T>();
  } catch (const json::exception&) {
    throw InputError(r.path(), std::string("/run run_json replay.") + key,
                     "has the wrong type: " + replay.at(key).dump());
  }
}

// [begin, end) runs of `role` among the roles.
std::vector<std::pair<int64_t, int64_t>> spans_of(const std::vector<trace::TokenRole>& roles,
                                                  trace::TokenRole role) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int64_t i = 0; i < int64_t(roles.size()); ++i) {
    if (roles[size_t(i)] != role) continue;
    if (!spans.empty() && spans.back().second == i)
      spans.back().second = i + 1;
    else
      spans.push_back({i, i + 1});
  }
  return spans;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

std::string event_text(const trace::Event& e) {
  return std::string(trace::event_kind_name(e.kind)) + " of token " + std::to_string(e.token) +
         " at layer " + std::to_string(e.layer) + " kv head " + std::to_string(e.kv_head) +
         " (reason " + std::to_string(e.reason) + ", tiers " + std::to_string(e.from_tier) +
         " -> " + std::to_string(e.to_tier) + ", score " + std::to_string(e.score) + ")";
}

std::string token_difference(const trace::TraceReader& a, const trace::TraceReader& b) {
  const int64_t n = std::min(a.n_tokens(), b.n_tokens());
  const std::vector<trace::TokenRecord> ta = a.tokens(0, n), tb = b.tokens(0, n);
  for (int64_t i = 0; i < n; ++i) {
    const trace::TokenRecord &x = ta[size_t(i)], &y = tb[size_t(i)];
    if (x.id != y.id || x.role != y.role || x.step != y.step)
      return "token " + std::to_string(i) + ": the original has id " + std::to_string(x.id) + " (" +
             trace::token_role_name(x.role) + ", step " + std::to_string(x.step) +
             "), the replay id " + std::to_string(y.id) + " (" + trace::token_role_name(y.role) +
             ", step " + std::to_string(y.step) + ")";
  }
  if (a.n_tokens() != b.n_tokens())
    return "the original has " + std::to_string(a.n_tokens()) + " tokens, the replay " +
           std::to_string(b.n_tokens());
  return "";
}

std::string event_difference(const trace::TraceReader& a, const trace::TraceReader& b) {
  for (int64_t s = 0; s < a.n_steps(); ++s) {
    const std::vector<trace::Event> ea = a.step_events(s), eb = b.step_events(s);
    for (size_t i = 0; i < std::min(ea.size(), eb.size()); ++i) {
      const trace::Event &x = ea[i], &y = eb[i];
      if (x.layer != y.layer || x.kv_head != y.kv_head || x.token != y.token || x.kind != y.kind ||
          x.reason != y.reason || x.from_tier != y.from_tier || x.to_tier != y.to_tier ||
          !same_float(x.score, y.score))
        return "step " + std::to_string(s) + ", event " + std::to_string(i) +
               " of the step: the original has " + event_text(x) + ", the replay " + event_text(y);
    }
    if (ea.size() != eb.size())
      return "step " + std::to_string(s) + ": the original has " + std::to_string(ea.size()) +
             " events, the replay " + std::to_string(eb.size()) +
             (ea.size() > eb.size() ? "; the first missing: " + event_text(ea[eb.size()])
                                    : "; the first extra: " + event_text(eb[ea.size()]));
  }
  return "";
}

}  // namespace

ReplaySource replay_source(const trace::TraceReader& r, const ReplayOverrides& o) {
  if (!r.complete())
    throw InputError(r.path(), "/run/complete",
                     "is 0: the capture did not finish; nothing to replay");
  const trace::RunInfo& run = r.run();
  if (run.tool_version != KVSCOPE_VERSION_STRING && !o.any_version)
    throw InputError(r.path(), "/run tool_version",
                     "is '" + run.tool_version + "', this KVScope is " + KVSCOPE_VERSION_STRING +
                         ": its replay need not be exact (--any-version replays it anyway and "
                         "the comparison says where it differs)");
  const json j = run_json_of(r);
  if (!j.contains("replay") || !j["replay"].is_object())
    throw InputError(r.path(), "/run run_json replay",
                     "absent: the trace was made before KVScope recorded what a replay needs "
                     "(format minor version 10); capture it again");
  const json& rp = j["replay"];

  ReplaySource s;
  s.model.model = o.model.empty() ? run.model.path : o.model;
  if (!std::filesystem::exists(s.model.model))
    throw InputError(r.path(), o.model.empty() ? "/run model_path" : "--model",
                     "'" + s.model.model + "' does not exist (the model the trace ran; --model " +
                         "names where it is now)");
  s.model.tokenizer = replay_field<std::string>(r, rp, "tokenizer");
  if (!s.model.tokenizer.empty() && !std::filesystem::exists(s.model.tokenizer))
    throw InputError(
        r.path(), "/run run_json replay.tokenizer",
        "'" + s.model.tokenizer + "' does not exist (the tokenizer the trace ran with)");
  s.model.dtype = run.model.dtype;
  s.model.kv_dtype = run.model.kv_dtype;
  s.model.device = o.device.empty() ? "cpu" : o.device;
  s.model.threads = o.threads;

  CaptureRequest& q = s.request;
  q.prompt_text = run.prompt;
  q.policy = run.policy;
  q.task_kind = run.task_kind;
  q.expected_answer = run.expected_answer;
  q.expected_answers = replay_field<std::vector<std::string>>(r, rp, "expected_answers");
  q.scorer = j.value("scorer", std::string());
  q.query = j.value("query", std::string());
  q.levels = replay_field<std::string>(r, rp, "levels");
  q.oracle = replay_field<bool>(r, rp, "oracle");
  q.oracle_recall_k = replay_field<int64_t>(r, rp, "oracle_recall_k");
  q.page_rows = replay_field<int64_t>(r, rp, "page_rows");
  q.device_prefill = replay_field<std::string>(r, rp, "device_prefill");
  q.answer_probe = replay_field<bool>(r, rp, "answer_probe");
  q.model_path = s.model.model;
  q.tokenizer_path = s.model.tokenizer;
  generate::GenerationOptions& g = q.generation;
  g.max_new_tokens = replay_field<int64_t>(r, rp, "max_new");
  g.prefill_chunk = replay_field<int64_t>(r, rp, "prefill_chunk");
  g.max_positions = replay_field<int64_t>(r, rp, "max_positions");
  g.stop_at_eos = replay_field<bool>(r, rp, "stop_at_eos");
  g.stop_strings = replay_field<std::vector<std::string>>(r, rp, "stop");
  g.sampling.greedy = replay_field<bool>(r, rp, "greedy");
  g.sampling.temperature = replay_field<double>(r, rp, "temperature");
  g.sampling.top_k = replay_field<int64_t>(r, rp, "top_k");
  g.sampling.top_p = replay_field<double>(r, rp, "top_p");
  g.sampling.seed = replay_field<uint64_t>(r, rp, "seed");
  const auto forced_count = replay_field<int64_t>(r, rp, "forced_tokens");

  if (j.contains("interventions"))
    s.recorded_interventions = j["interventions"].get<std::vector<std::string>>();
  // The run's own description, without what the replay records anew.
  json own = j;
  for (const char* key : {"replay", "interventions", "replay_of", "scorer", "query"})
    own.erase(key);
  q.run_json = own.dump();

  const std::vector<trace::StepRecord> steps = r.steps(0, r.n_steps());
  const std::vector<trace::TokenRecord> tokens = r.tokens(0, r.n_tokens());
  for (const trace::TokenRecord& t : tokens) {
    const trace::StepKind kind = steps[size_t(t.step)].kind;
    if (kind == trace::StepKind::Prefill) {
      s.prefill_ids.push_back(t.id);
      s.prefill_roles.push_back(t.role);
    } else if (kind == trace::StepKind::Decode && t.role != trace::TokenRole::Generated) {
      g.forced_tokens.push_back(t.id);
    }
  }
  if (int64_t(g.forced_tokens.size()) != forced_count)
    throw InputError(r.path(), "/tokens/role",
                     "the decode steps feed " + std::to_string(g.forced_tokens.size()) +
                         " tokens of the prompt's roles; /run run_json replay.forced_tokens says " +
                         std::to_string(forced_count));
  return s;
}

void finish_replay_request(const generate::Engine& engine, ReplaySource* s) {
  const int64_t vocab = engine.model->config().vocab_size;
  std::vector<trace::TokenRole> roles;
  CaptureRequest& q = s->request;
  q.prompt_ids.clear();
  for (size_t i = 0; i < s->prefill_ids.size(); ++i) {
    if (s->prefill_ids[i] >= vocab) continue;  // a policy's inserted token: it inserts it again
    q.prompt_ids.push_back(s->prefill_ids[i]);
    roles.push_back(s->prefill_roles[i]);
  }
  // Forced tokens carry the prompt's roles too (a question fed after it).
  const std::vector<int32_t>& forced = q.generation.forced_tokens;
  roles.resize(roles.size() + forced.size(), trace::TokenRole::Prompt);
  q.needle_spans = spans_of(roles, trace::TokenRole::Needle);
  q.question_spans = spans_of(roles, trace::TokenRole::Question);
}

policy::InterventionShape intervention_shape(const trace::TraceReader& r) {
  policy::InterventionShape s;
  s.layers = r.n_layers();
  s.kv_heads = r.n_kv_heads();
  s.tokens = r.n_tokens();
  s.steps = r.n_steps();
  const std::vector<uint8_t> roles = r.token_roles(0, r.n_tokens());
  for (int32_t t = 0; t < int32_t(roles.size()); ++t) {
    if (roles[size_t(t)] == uint8_t(trace::TokenRole::Needle)) s.needle.push_back(t);
    if (roles[size_t(t)] == uint8_t(trace::TokenRole::Question)) s.question.push_back(t);
  }
  return s;
}

void check_restores_something(const trace::TraceReader& r, const policy::Intervention& iv) {
  using policy::InterventionKind;
  if (iv.kind != InterventionKind::Restore && iv.kind != InterventionKind::Only) return;
  const int64_t K = r.n_kv_heads();
  for (const trace::Event& e : r.events(0, r.n_events())) {
    if (e.step < iv.from_step || !analysis::readable_loss(r, e)) continue;
    const bool in = iv.covers(e.layer, e.kv_head, K);
    if (iv.kind == InterventionKind::Only ? !in : in) return;
  }
  throw InputError(
      "", "--intervene",
      iv.text + ": the policy of " + r.path() + " evicted, rejected or offloaded " + "nothing " +
          (iv.kind == InterventionKind::Only ? "outside those heads" : "in those heads") +
          (iv.from_step > 0 ? " from step " + std::to_string(iv.from_step) : "") +
          ": there is nothing to restore");
}

std::string first_difference(const trace::TraceReader& a, const trace::TraceReader& b) {
  if (std::string d = token_difference(a, b); !d.empty()) return d;
  if (a.n_steps() != b.n_steps())
    return "the original has " + std::to_string(a.n_steps()) + " steps, the replay " +
           std::to_string(b.n_steps());
  const std::vector<trace::StepRecord> sa = a.steps(0, a.n_steps()), sb = b.steps(0, b.n_steps());
  for (size_t s = 0; s < sa.size(); ++s)
    if (sa[s].kind != sb[s].kind || sa[s].n_tokens != sb[s].n_tokens ||
        sa[s].entries != sb[s].entries)
      return "step " + std::to_string(s) + ": the original holds " + std::to_string(sa[s].entries) +
             " entries after it, the replay " + std::to_string(sb[s].entries);
  if (std::string d = event_difference(a, b); !d.empty()) return d;
  if (a.layout().oracle && b.layout().oracle) {
    const std::vector<float> ka = a.oracle_kl(0, a.n_steps()), kb = b.oracle_kl(0, b.n_steps());
    for (size_t s = 0; s < ka.size(); ++s)
      if (!same_float(ka[s], kb[s]))
        return "step " + std::to_string(s) + ": the oracle's KL is " + std::to_string(ka[s]) +
               " in the original, " + std::to_string(kb[s]) + " in the replay";
  }
  if (a.task_success() != b.task_success())
    return "task success: the original " + std::to_string(a.task_success()) + ", the replay " +
           std::to_string(b.task_success());
  return "";
}

}  // namespace kvscope::recorder
