#include "capture/recorder/capture_run.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "capture/cache/ragged_cache.h"
#include "capture/policy/registry.h"
#include "capture/recorder/capture_levels.h"
#include "capture/recorder/oracle.h"
#include "capture/recorder/recorder.h"
#include "capture/tasks/scorers.h"
#include "capture/tasks/task_common.h"
#include "core/common/check.h"
#include "core/common/input_error.h"
#include "core/common/memory_limit.h"
#include "core/trace/writer.h"
#include "kvscope_version.h"

namespace kvscope::recorder {

namespace {

// The request's run JSON with the task's scorer and question protocol in it
// ("scorer", "query"), so that a trace says how its score was computed, and
// what a replay needs beyond the trace's tokens ("replay": the generation
// options, the answers, the capture's settings; kvscope replay), with a
// replay's own interventions and origin.
std::string run_json_recorded(const CaptureRequest& req) {
  nlohmann::json j = nlohmann::json::parse(req.run_json);
  if (!req.scorer.empty()) j["scorer"] = req.scorer;
  if (!req.query.empty()) j["query"] = req.query;
  const generate::GenerationOptions& g = req.generation;
  j["replay"] = {{"tokenizer", req.tokenizer_path},
                 {"max_new", g.max_new_tokens},
                 {"prefill_chunk", g.prefill_chunk},
                 {"max_positions", g.max_positions},
                 {"stop_at_eos", g.stop_at_eos},
                 {"stop", g.stop_strings},
                 {"greedy", g.sampling.greedy},
                 {"temperature", g.sampling.temperature},
                 {"top_k", g.sampling.top_k},
                 {"top_p", g.sampling.top_p},
                 {"seed", g.sampling.seed},
                 {"forced_tokens", g.forced_tokens.size()},
                 {"expected_answers", req.expected_answers},
                 {"levels", req.levels},
                 {"oracle", req.oracle},
                 {"oracle_recall_k", req.oracle_recall_k},
                 {"page_rows", req.page_rows},
                 {"device_prefill", req.device_prefill},
                 {"answer_probe", req.answer_probe}};
  if (!req.interventions.empty()) {
    j["interventions"] = nlohmann::json::array();
    for (const policy::Intervention& iv : req.interventions) j["interventions"].push_back(iv.text);
  }
  if (!req.replay_of.empty()) j["replay_of"] = req.replay_of;
  return j.dump();
}

trace::RunInfo run_info(const generate::Engine& engine, const policy::PolicyInstance& pi,
                        const CaptureRequest& req, const CaptureLevels& levels,
                        const policy::StepDriver::Options& options) {
  const model::ModelConfig& c = engine.model->config();
  trace::RunInfo run;
  run.model.name = c.name;
  run.model.path = req.model_path;
  run.model.architecture = model::architecture_name(c.arch);
  run.model.dtype = generate::dtype_name(engine.dtype);
  run.model.kv_dtype = generate::dtype_name(engine.kv_dtype);
  run.model.device = engine.device.str();
  run.model.n_layers = c.n_layers;
  run.model.n_heads = c.n_heads;
  run.model.n_kv_heads = c.n_kv_heads;
  run.model.head_dim = c.head_dim;
  run.model.vocab_size = c.vocab_size;
  run.model.context_length = c.context_length;
  run.model.layer_window = c.sliding_window;
  for (int64_t l = 0; l < c.n_layers; ++l)
    run.model.layer_ffn.push_back(c.moe_layer(l) ? "moe" : "dense");
  run.policy = req.policy;
  run.policy_name = pi.name;
  run.policy_params_json = policy::params_json_after_setup(pi);
  run.budget_kind = pi.policy->budget_kind();
  run.budget = pi.policy->budget();
  run.seed = req.generation.sampling.seed;
  run.prompt = req.prompt_text;
  run.capture_levels = levels.text + (req.oracle ? "+oracle" : "");
  run.command_line = req.command_line;
  run.run_json = run_json_recorded(req);
  run.tier_names.clear();
  run.tier_attended.clear();
  // A tier declared F32 is stored at the run's --kv-dtype (TierSpec).
  const cache::RowFormat full = cache::float_format(engine.kv_dtype);
  for (const cache::TierSpec& t : policy::StepDriver::tiers_of(*pi.policy, options)) {
    run.tier_names.push_back(t.name);
    run.tier_attended.push_back(t.attended ? 1 : 0);
    run.tier_formats.push_back(
        cache::row_format_name(t.format == cache::RowFormat::F32 ? full : t.format));
  }
  run.reason_names = policy::StepDriver::reason_names_of(*pi.policy, options);
  run.task_kind = req.task_kind;
  run.expected_answer = req.expected_answer;
  run.tool_version = KVSCOPE_VERSION_STRING;
  return run;
}

// The request with `n` inserted tokens (ids first_id..) at prompt position
// `at`: the spans after it move on by n.
CaptureRequest with_inserted_tokens(const CaptureRequest& req, int64_t at, int64_t n,
                                    int32_t first_id) {
  CaptureRequest r = req;
  if (n <= 0) return r;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(first_id + int32_t(i));
  r.prompt_ids.insert(r.prompt_ids.begin() + at, ids.begin(), ids.end());
  for (auto* spans : {&r.needle_spans, &r.question_spans})
    for (auto& [b, e] : *spans) {
      if (b >= at) b += n;
      if (e > at) e += n;
    }
  return r;
}

void mark_roles(trace::StepData* sd, const CaptureRequest& req) {
  for (trace::TokenRecord& t : sd->tokens) {
    if (t.role != trace::TokenRole::Prompt) continue;
    for (auto [b, e] : req.needle_spans)
      if (t.position >= b && t.position < e) t.role = trace::TokenRole::Needle;
    for (auto [b, e] : req.question_spans)
      if (t.position >= b && t.position < e) t.role = trace::TokenRole::Question;
  }
}

// Where a driver's layer steps were attended, when not all by the host
// kernels (empty otherwise): a line of the capture's notes ("prefix" names
// the driver).
std::string attention_note(torch::Device device, const std::string& device_prefill,
                           const policy::StepDriver& driver, const std::string& prefix) {
  if (device.is_cuda())
    return prefix + "attention on " + device.str() + ": " + std::to_string(driver.device_layers()) +
           " layer steps by the CUDA kernels, " + std::to_string(driver.blocked_layers()) +
           " by blocked matrix products (several attended tiers, INT4 tiers), " +
           std::to_string(driver.host_layers()) +
           " by the host kernels (selection masks, weight-level capture, pruned keys)";
  if (device_prefill == "blocked")
    return prefix + "prefill on the cpu: " + std::to_string(driver.blocked_layers()) +
           " layer steps by blocked matrix products, " + std::to_string(driver.host_layers()) +
           " by the host kernels (decode steps, selection masks, weight-level capture, pruned "
           "keys)";
  return "";
}

}  // namespace

trace::CaptureLayout capture_layout(const CaptureLevels& levels, const policy::Policy& policy,
                                    int64_t max_tokens, bool oracle, int64_t recall_k) {
  trace::CaptureLayout layout;
  layout.max_tokens = max_tokens;
  layout.received = levels.received;
  layout.pooled_block = levels.pooled_block;
  layout.dense_heads = levels.dense;
  layout.topk = levels.topk;
  layout.oracle = oracle;
  layout.oracle_recall_k = recall_k;
  layout.gates = policy.gates();
  layout.series = policy.series();
  return layout;
}

std::vector<int32_t> answer_probe_tokens(const tokenizer::Tokenizer& tokenizer,
                                         const std::string& context_text,
                                         const std::string& answer) {
  const bool spaced = context_text.empty() ||
                      std::isspace(static_cast<unsigned char>(context_text.back())) ||
                      (!answer.empty() && std::isspace(static_cast<unsigned char>(answer.front())));
  const std::string next = spaced ? answer : " " + answer;
  // The answer as it tokenises after the context's last words (a tokenizer
  // may merge across the boundary or treat a leading space specially): the
  // tokens of tail + answer past those of the tail, when they extend them.
  size_t from = context_text.size() > 64 ? context_text.size() - 64 : 0;
  while (from > 0 && from < context_text.size() &&
         !std::isspace(static_cast<unsigned char>(context_text[from])))
    ++from;
  const std::string tail = context_text.substr(std::min(from, context_text.size()));
  const std::vector<int32_t> a = tokenizer.encode(tail, /*add_special=*/false);
  const std::vector<int32_t> b = tokenizer.encode(tail + next, /*add_special=*/false);
  if (!tail.empty() && b.size() > a.size() && std::equal(a.begin(), a.end(), b.begin()))
    return std::vector<int32_t>(b.begin() + int64_t(a.size()), b.end());
  return tokenizer.encode(next, /*add_special=*/false);
}

void set_task(const tasks::TaskPrompt& task, CaptureRequest* r) {
  r->prompt_text = task.prompt_text;
  r->prompt_ids = task.ids;
  r->generation.forced_tokens = task.forced;
  r->task_kind = task.kind;
  r->expected_answer = task.answer;
  r->expected_answers = task.answers;
  r->scorer = task.scorer;
  r->query = task.question_after ? "after" : "inside";
  r->needle_spans = task.needle_spans;
  r->question_spans = task.question_spans;
}

namespace {

// The run as the policy's plan shapes it: the request with the inserted
// tokens in place, and the sizes every later phase works with.
struct PlannedRun {
  policy::PolicyInstance pi;
  policy::CapturePlan plan;
  CaptureRequest req;
  int64_t inserted_at = 0;  // where the inserted tokens go (the plan's `at`, else the prompt's end)
  int64_t prompt_tokens = 0, forced_tokens = 0;
  int64_t max_positions = 0;  // of the sequence: the model's context or the run's length
  int64_t max_tokens = 0;     // of the cache and the trace: the sequence and the pass's chunks
  std::vector<int32_t> answer_probe{};  // the answer probe's tokens (empty: none)
  std::unique_ptr<policy::Interventions> interventions{};  // null: none
};

// The answer probe's tokens (room for them in the cache) and the replay's
// interventions, checked against the model's shape.
void plan_probe_and_interventions(const generate::Engine& engine, PlannedRun* r) {
  const CaptureRequest& req = r->req;
  const std::string& answer =
      req.expected_answers.empty() ? req.expected_answer : req.expected_answers.front();
  if (req.answer_probe && !answer.empty() && engine.tokenizer) {
    // The answer follows the forced tokens (a question fed after the prompt) when there are any.
    const std::vector<int32_t>& forced = req.generation.forced_tokens;
    const std::string context =
        forced.empty() ? req.prompt_text : engine.tokenizer->decode(forced, /*skip_special=*/false);
    r->answer_probe = answer_probe_tokens(*engine.tokenizer, context, answer);
    const int64_t end = r->prompt_tokens + r->forced_tokens + int64_t(r->answer_probe.size());
    r->max_tokens = std::max(r->max_tokens, end);
  }
  if (req.interventions.empty()) return;
  const model::ModelConfig& c = engine.model->config();
  for (const policy::Intervention& iv : req.interventions)
    if (int64_t(iv.heads.size()) != c.n_layers * c.n_kv_heads)
      throw InputError("", "--intervene",
                       iv.text + ": resolved for another model shape than " + c.name + "'s " +
                           std::to_string(c.n_layers) + " layers x " +
                           std::to_string(c.n_kv_heads) + " kv heads");
  r->interventions =
      std::make_unique<policy::Interventions>(req.interventions, c.n_layers, c.n_kv_heads);
}

// Phase 1: the policy, its plan and the sizes; everything that can refuse
// the run does so here, before the trace exists.
PlannedRun plan_run(const generate::Engine& engine, const CaptureRequest& request) {
  const model::ModelConfig& config = engine.model->config();
  PlannedRun r{
      policy::make_policy(request.policy, {int64_t(request.prompt_ids.size()), request.model_path}),
      {},
      {}};
  r.plan = r.pi.policy->plan({request.prompt_ids, engine.tokenizer.get(), config});
  r.inserted_at = r.plan.at >= 0 ? r.plan.at : int64_t(request.prompt_ids.size());
  r.req = with_inserted_tokens(request, r.inserted_at, r.plan.inserted.count(),
                               int32_t(config.vocab_size));
  r.prompt_tokens = int64_t(r.req.prompt_ids.size());
  r.forced_tokens = int64_t(r.req.generation.forced_tokens.size());
  const int64_t run_tokens = r.prompt_tokens + r.forced_tokens + r.req.generation.max_new_tokens;
  r.max_positions = std::min<int64_t>(config.context_length, run_tokens);
  generate::check_prompt_fits(r.prompt_tokens, r.max_positions);
  if (r.forced_tokens > 0)
    generate::check_prompt_fits(r.prompt_tokens + r.forced_tokens, r.max_positions,
                                "prompt + forced tokens");
  // The reconstruction pass feeds its chunks at the positions after the
  // prompt: the cache and the trace's key axis cover them.
  r.max_tokens = run_tokens;
  for (const policy::ReconstructionChunk& chunk : r.plan.reconstruction) {
    const int64_t end = r.prompt_tokens + int64_t(chunk.ids.size());
    if (end > config.context_length)
      throw InputError("--policy", r.req.policy,
                       "its context-reconstruction pass feeds " + std::to_string(chunk.ids.size()) +
                           " tokens after the prompt's " + std::to_string(r.prompt_tokens) +
                           ", beyond the model's context of " +
                           std::to_string(config.context_length) +
                           " positions (a smaller chunk= or a shorter prompt)");
    r.max_tokens = std::max(r.max_tokens, end);
  }
  plan_probe_and_interventions(engine, &r);
  return r;
}

// Phase 3: the trace, when the levels ask for one (null for --capture none).
std::unique_ptr<trace::TraceWriter> open_writer(const generate::Engine& engine, const PlannedRun& r,
                                                const CaptureLevels& levels,
                                                const policy::StepDriver::Options& options) {
  if (levels.none) return nullptr;
  const CaptureRequest& req = r.req;
  if (req.output.empty()) throw InputError("", "-o", "an output trace path is required");
  trace::RunInfo run = run_info(engine, r.pi, req, levels, options);
  run.model.vocab_size +=
      r.plan.inserted.count();  // the inserted tokens' ids follow the vocabulary
  const trace::CaptureLayout layout =
      capture_layout(levels, *r.pi.policy, r.max_tokens, req.oracle, req.oracle_recall_k);
  check_fits_in_memory(
      "", "--capture",
      trace::TraceWriter::estimate_memory_bytes(run, layout, r.max_tokens,
                                                req.generation.prefill_chunk, {}),
      "the trace of " + std::to_string(r.max_tokens) + " tokens at --capture " + req.levels);
  return trace::TraceWriter::create(req.output, run, layout);
}

// Phase 4: what each generator step becomes in the trace and the result.
class StepSink {
 public:
  StepSink(const PlannedRun& r, const policy::StepDriver& driver, Recorder& recorder,
           OracleShadow* oracle, trace::TraceWriter* writer, CaptureResult& result)
      : r_(r),
        driver_(driver),
        recorder_(recorder),
        oracle_(oracle),
        writer_(writer),
        result_(result) {}

  void operator()(const generate::StepEvent& ev) {
    if (ev.side_ids) return reconstruction_step(ev);
    if (ev.prefill && ev.token >= 0) decode_policy_start_ = driver_.policy_seconds();
    std::vector<int32_t> ids;
    if (ev.prefill)
      ids.assign(r_.req.prompt_ids.begin() + ev.pos0, r_.req.prompt_ids.begin() + ev.pos0 + ev.n);
    else
      ids.push_back(fed_generated_.back());
    if (ev.token >= 0) fed_generated_.push_back(ev.token);
    trace::StepData sd = oracle_ && !ev.inserted ? with_oracle(ev, ids) : finish(ev, ids);
    mark_roles(&sd, r_.req);
    append(sd);
    if (r_.req.progress) r_.req.progress({ev.pos0 + ev.n, r_.max_tokens, result_.steps});
  }

  // Policy time when the prefill ended (-1: it never did).
  double decode_policy_start() const { return decode_policy_start_; }

 private:
  // A reconstruction step: no oracle step, no sequence tokens.
  void reconstruction_step(const generate::StepEvent& ev) {
    trace::StepData sd = recorder_.finish_reconstruction_step(ev.pos0, *ev.side_ids);
    decode_policy_start_ = driver_.policy_seconds();  // the prefill's policy time includes it
    append(sd);
  }

  // A decode step feeding a forced token records it like prompt text, and
  // text is generated only from the first sampled token on.
  trace::StepData finish(const generate::StepEvent& ev, const std::vector<int32_t>& ids) {
    const bool feeds_forced = !ev.prefill && ev.pos0 < r_.prompt_tokens + r_.forced_tokens;
    return recorder_.finish_step(ev.pos0, ids, ev.prefill, ev.forced ? -1 : ev.token, feeds_forced);
  }

  // The full-cache reference runs the step first (it has no inserted
  // tokens); its last query then judges the step's stalls.
  trace::StepData with_oracle(const generate::StepEvent& ev, const std::vector<int32_t>& ids) {
    recorder_.pause();
    torch::Tensor t = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
    trace::OracleRow row = oracle_->step(t, ev.pos0, *ev.logits);
    recorder_.resume();
    trace::StepData sd = finish(ev, ids);
    sd.has_oracle = true;
    sd.oracle = std::move(row);
    for (trace::StallRow& st : sd.stalls)
      st.needed = oracle_->needed(st.layer, st.kv_head, st.token);
    return sd;
  }

  void append(const trace::StepData& sd) {
    result_.peak_kv_bytes = std::max(result_.peak_kv_bytes, sd.step.kv_bytes);
    result_.final_entries = sd.step.entries;
    result_.final_kv_bytes = sd.step.kv_bytes;
    if (writer_) writer_->append_step(sd);
    ++result_.steps;
  }

  const PlannedRun& r_;
  const policy::StepDriver& driver_;
  Recorder& recorder_;
  OracleShadow* oracle_;
  trace::TraceWriter* writer_;
  CaptureResult& result_;
  double decode_policy_start_ = -1;
  std::vector<int32_t> fed_generated_;  // the token each decode step feeds
};

// Phase 5's options: the plan's passes and inserted tokens for the generator.
generate::GenerationOptions generation_options(const PlannedRun& r) {
  generate::GenerationOptions g = r.req.generation;
  if (g.max_positions <= 0) g.max_positions = r.max_positions;
  g.answer_probe = r.answer_probe;
  for (const policy::ReconstructionChunk& chunk : r.plan.reconstruction)
    g.side_passes.push_back(chunk.ids);
  const int64_t inserted = r.plan.inserted.count();
  // Inserted tokens sit where the reconstruction would start: the side
  // passes run after them.
  g.side_passes_at = inserted > 0 ? r.inserted_at : r.plan.at;
  if (inserted > 0) {
    g.inserted_model = r.plan.inserted.model ? r.plan.inserted.model() : nullptr;
    g.inserted_at = r.inserted_at;
    g.inserted = inserted;
    KVSCOPE_CHECK(g.inserted_model != nullptr,
                  "run_capture: the policy inserts tokens but has no model for them");
  }
  return g;
}

// Phase 6: the task's score from the generated text.
void score_answers(const CaptureRequest& req, CaptureResult* result) {
  const std::string& text = result->generation.text;
  if (!req.expected_answers.empty()) {
    result->answers_found = tasks::answers_found(req.expected_answers, text);
    if (req.scorer.empty()) {
      result->success = result->answers_found == int64_t(req.expected_answers.size());
      result->score = tasks::answer_score(req.expected_answers, text);
    } else {
      // A full score is a success (for F1 and ROUGE-L an exact answer):
      // ROUGE-L's F carries LongBench's 1e-8 in its denominator, so a
      // perfect answer scores 2 / (2 + 1e-8).
      result->score =
          tasks::find_scorer(req.scorer, "", "scorer").score(req.expected_answers, text);
      result->success = result->score >= 1.0 - 1e-6;
    }
  } else if (!req.expected_answer.empty()) {
    result->success = text.find(req.expected_answer) != std::string::npos;
    result->answers_found = result->success ? 1 : 0;
    result->score = result->success ? 1.0 : 0.0;
  }
}

void close_writer(const CaptureRequest& req, const CaptureResult& result,
                  trace::TraceWriter* writer) {
  trace::GenerationSummary summary;
  const std::string& fr = result.generation.finish_reason;
  summary.finish_reason = fr == "context" ? "length" : fr;
  summary.success = req.expected_answer.empty() ? -1 : (result.success ? 1 : 0);
  if (!req.expected_answer.empty()) summary.score = result.score;
  summary.answer_logprob = result.answer_logprob;
  summary.answer_rank = result.answer_rank;
  writer->close(summary);
}

}  // namespace

// The phases: plan the run (policy, plan, sizes); build the driver, the
// recorder and the oracle; open the trace; run the generator with a sink
// recording each step; then the notes, the score and the trace's close.
CaptureResult run_capture(generate::Engine& engine, const CaptureRequest& request) {
  torch::InferenceMode inference;
  const model::ModelConfig& config = engine.model->config();
  PlannedRun r = plan_run(engine, request);
  const CaptureRequest& req = r.req;
  CaptureLevels levels = parse_capture_levels(req.levels, config.n_layers, config.n_heads);
  if (levels.none && req.oracle)
    throw InputError("--capture", "none",
                     "--oracle needs a trace to write to (drop --capture none)");

  // Phase 2: the policy set up, its driver and what observes it.
  policy::StepDriver::Options options{req.page_rows, r.max_tokens, r.prompt_tokens,
                                      cache::float_format(engine.kv_dtype)};
  // The oracle's full cache gets none of the replay's interventions.
  const policy::StepDriver::Options oracle_options = options;
  options.interventions = r.interventions.get();
  r.pi.policy->setup(
      {&config, r.max_tokens, r.prompt_tokens, req.page_rows, &engine.model->weights()});
  policy::StepDriver driver(config, options, *r.pi.policy, r.pi.name);
  const cache::DevicePrefill prefill = cache::parse_device_prefill(req.device_prefill);
  driver.use_device(engine.device, prefill);
  driver.set_reconstruction(r.plan.reconstruction);
  Recorder recorder(driver, engine.tokenizer.get(), levels, req.prompt_text);
  if (r.plan.inserted.count() > 0)
    recorder.set_inserted_tokens(int32_t(config.vocab_size), r.plan.inserted.names);
  std::unique_ptr<OracleShadow> oracle;
  if (req.oracle) {
    recorder.set_track_attended(true);
    oracle = std::make_unique<OracleShadow>(*engine.model, oracle_options, req.oracle_recall_k,
                                            recorder, driver.cache(), engine.device, prefill);
  }
  if (recorder.wants_probs(0)) driver.set_observer(&recorder);

  std::unique_ptr<trace::TraceWriter> writer = open_writer(engine, r, levels, options);
  CaptureResult result;
  result.notes = r.pi.notes;
  StepSink sink(r, driver, recorder, oracle.get(), writer.get(), result);
  generate::Generator generator(*engine.model, driver, engine.tokenizer.get());
  // On an exception the writer's destructor flushes what was captured and
  // leaves complete = 0.
  result.generation = generator.run(req.prompt_ids, generation_options(r), {},
                                    [&sink](const generate::StepEvent& ev) { sink(ev); });

  result.policy_seconds = driver.policy_seconds();
  result.decode_policy_seconds =
      sink.decode_policy_start() < 0 ? 0 : driver.policy_seconds() - sink.decode_policy_start();
  std::vector<std::string> where{attention_note(engine.device, req.device_prefill, driver, "")};
  if (oracle)
    where.push_back(attention_note(engine.device, req.device_prefill, oracle->driver(),
                                   "the oracle's full cache: "));
  for (const std::string& note : where)
    if (!note.empty()) result.notes.push_back(note);
  score_answers(req, &result);
  result.answer_logprob = result.generation.answer_logprob;
  result.answer_rank = result.generation.answer_rank;
  if (!std::isnan(result.answer_logprob)) result.answer_tokens = r.answer_probe;
  if (writer) close_writer(req, result, writer.get());
  return result;
}

}  // namespace kvscope::recorder
