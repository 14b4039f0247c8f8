#include "capture/recorder/capture_run.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>

#include "capture/cache/ragged_cache.h"
#include "capture/policy/registry.h"
#include "capture/recorder/capture_levels.h"
#include "capture/recorder/oracle.h"
#include "capture/recorder/recorder.h"
#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"
#include "core/common/memory_limit.h"
#include "core/trace/writer.h"
#include "kvscope_version.h"

namespace kvscope::recorder {

namespace {

trace::RunInfo run_info(const generate::Engine& engine, const policy::PolicyInstance& pi,
                        const CaptureRequest& req, const CaptureLevels& levels) {
  const model::ModelConfig& c = engine.model->config();
  trace::RunInfo run;
  run.model.name = c.name;
  run.model.path = req.model_path;
  run.model.architecture = model::architecture_name(c.arch);
  run.model.dtype = generate::dtype_name(engine.dtype);
  run.model.device = engine.device.str();
  run.model.n_layers = c.n_layers;
  run.model.n_heads = c.n_heads;
  run.model.n_kv_heads = c.n_kv_heads;
  run.model.head_dim = c.head_dim;
  run.model.vocab_size = c.vocab_size;
  run.model.context_length = c.context_length;
  run.policy = req.policy;
  run.policy_name = pi.name;
  run.policy_params_json = policy::params_json_after_setup(pi);
  run.budget_kind = pi.policy->budget_kind();
  run.budget = pi.policy->budget();
  run.seed = req.generation.sampling.seed;
  run.prompt = req.prompt_text;
  run.capture_levels = levels.text + (req.oracle ? "+oracle" : "");
  run.command_line = req.command_line;
  run.run_json = req.run_json;
  run.tier_names.clear();
  run.tier_attended.clear();
  for (const cache::TierSpec& t : pi.policy->tiers()) {
    run.tier_names.push_back(t.name);
    run.tier_attended.push_back(t.attended ? 1 : 0);
  }
  run.reason_names = pi.policy->reason_names();
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

void set_task(const tasks::TaskPrompt& task, CaptureRequest* r) {
  r->prompt_text = task.prompt_text;
  r->prompt_ids = task.ids;
  r->generation.forced_tokens = task.forced;
  r->task_kind = task.kind;
  r->expected_answer = task.answer;
  r->expected_answers = task.answers;
  r->needle_spans = task.needle_spans;
  r->question_spans = task.question_spans;
}

CaptureResult run_capture(generate::Engine& engine, const CaptureRequest& request) {
  torch::InferenceMode inference;
  const model::ModelConfig& config = engine.model->config();
  policy::PolicyInstance pi =
      policy::make_policy(request.policy, {int64_t(request.prompt_ids.size()), request.model_path});
  // Tokens the policy inserts (RestoreKV's restore tokens) become prompt
  // tokens after its reconstruction pass: the positions after them move on.
  const int64_t inserted = pi.policy->inserted_tokens(config);
  std::vector<policy::ReconstructionChunk> reconstruction =
      pi.policy->reconstruction(request.prompt_ids, engine.tokenizer.get());
  const int64_t inserted_at = pi.policy->reconstruction_at() >= 0
                                  ? pi.policy->reconstruction_at()
                                  : int64_t(request.prompt_ids.size());
  const CaptureRequest req =
      with_inserted_tokens(request, inserted_at, inserted, int32_t(config.vocab_size));
  const int64_t prompt_tokens = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t forced_tokens = static_cast<int64_t>(req.generation.forced_tokens.size());
  const int64_t run_tokens = prompt_tokens + forced_tokens + req.generation.max_new_tokens;
  // Everything that can refuse the run does so before the trace exists.
  const int64_t max_positions = std::min<int64_t>(config.context_length, run_tokens);
  generate::check_prompt_fits(prompt_tokens, max_positions);
  if (forced_tokens > 0)
    generate::check_prompt_fits(prompt_tokens + forced_tokens, max_positions,
                                "prompt + forced tokens");

  // A policy's context-reconstruction pass (KVzip) feeds its chunks at the
  // positions after the prompt (or after the context of a chat prompt,
  // Policy::reconstruction_at): the cache and the trace's key axis cover them.
  int64_t max_tokens = run_tokens;
  for (const policy::ReconstructionChunk& chunk : reconstruction) {
    const int64_t end = prompt_tokens + int64_t(chunk.ids.size());
    if (end > config.context_length)
      throw InputError("--policy", req.policy,
                       "its context-reconstruction pass feeds " + std::to_string(chunk.ids.size()) +
                           " tokens after the prompt's " + std::to_string(prompt_tokens) +
                           ", beyond the model's context of " +
                           std::to_string(config.context_length) +
                           " positions (a smaller chunk= or a shorter prompt)");
    max_tokens = std::max(max_tokens, end);
  }
  CaptureLevels levels = parse_capture_levels(req.levels, config.n_layers, config.n_heads);
  if (levels.none && req.oracle)
    throw InputError("--capture", "none",
                     "--oracle needs a trace to write to (drop --capture none)");
  policy::StepDriver::Options options{req.page_rows, max_tokens, prompt_tokens};
  pi.policy->setup({&config, max_tokens, prompt_tokens, req.page_rows, &engine.model->weights()});
  policy::StepDriver driver(config, options, *pi.policy, pi.name);
  driver.use_device(engine.device, cache::parse_device_prefill(req.device_prefill));
  std::vector<std::vector<int32_t>> side_passes;
  for (const policy::ReconstructionChunk& chunk : reconstruction) side_passes.push_back(chunk.ids);
  driver.set_reconstruction(std::move(reconstruction));
  const cache::RaggedKvCache& cache = driver.cache();

  Recorder recorder(driver, engine.tokenizer.get(), levels, req.prompt_text);
  if (inserted > 0)
    recorder.set_inserted_tokens(int32_t(config.vocab_size), pi.policy->inserted_names());
  std::unique_ptr<OracleShadow> oracle;
  if (req.oracle) {
    recorder.set_track_attended(true);
    oracle = std::make_unique<OracleShadow>(*engine.model, options, req.oracle_recall_k, recorder,
                                            cache, engine.device,
                                            cache::parse_device_prefill(req.device_prefill));
  }
  if (recorder.wants_probs(0)) driver.set_observer(&recorder);

  std::unique_ptr<trace::TraceWriter> writer;
  if (!levels.none) {
    if (req.output.empty()) throw InputError("", "-o", "an output trace path is required");
    trace::RunInfo run = run_info(engine, pi, req, levels);
    run.model.vocab_size += inserted;  // the inserted tokens' ids follow the vocabulary
    const trace::CaptureLayout layout =
        capture_layout(levels, *pi.policy, max_tokens, req.oracle, req.oracle_recall_k);
    check_fits_in_memory(
        "", "--capture",
        trace::TraceWriter::estimate_memory_bytes(run, layout, max_tokens,
                                                  req.generation.prefill_chunk, {}),
        "the trace of " + std::to_string(max_tokens) + " tokens at --capture " + req.levels);
    writer = trace::TraceWriter::create(req.output, run, layout);
  }

  CaptureResult result;
  result.notes = pi.notes;
  double decode_policy_start = -1;     // policy time when the prefill ended
  std::vector<int32_t> fed_generated;  // the token each decode step feeds
  auto on_step = [&](const generate::StepEvent& ev) {
    if (ev.side_ids) {  // a reconstruction step: no oracle step, no sequence tokens
      trace::StepData sd = recorder.finish_reconstruction_step(ev.pos0, *ev.side_ids);
      decode_policy_start = driver.policy_seconds();  // the prefill's policy time includes it
      result.peak_kv_bytes = std::max(result.peak_kv_bytes, sd.step.kv_bytes);
      result.final_entries = sd.step.entries;
      result.final_kv_bytes = sd.step.kv_bytes;
      if (writer) writer->append_step(sd);
      ++result.steps;
      return;
    }
    if (ev.prefill && ev.token >= 0) decode_policy_start = driver.policy_seconds();  // prefill done
    std::vector<int32_t> ids;
    if (ev.prefill)
      ids.assign(req.prompt_ids.begin() + ev.pos0, req.prompt_ids.begin() + ev.pos0 + ev.n);
    else
      ids.push_back(fed_generated.back());
    if (ev.token >= 0) fed_generated.push_back(ev.token);
    // A decode step feeding a forced token records it like prompt text, and
    // text is generated only from the first sampled token on.
    const bool feeds_forced = !ev.prefill && ev.pos0 < prompt_tokens + forced_tokens;
    const int32_t sampled = ev.forced ? -1 : ev.token;
    trace::StepData sd;
    if (oracle && !ev.inserted) {  // the full-cache reference has no inserted tokens
      recorder.pause();
      torch::Tensor t = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
      trace::OracleRow row = oracle->step(t, ev.pos0, *ev.logits);
      recorder.resume();
      sd = recorder.finish_step(ev.pos0, ids, ev.prefill, sampled, feeds_forced);
      sd.has_oracle = true;
      sd.oracle = std::move(row);
      // The shadow has run this step: its last query judges the step's stalls.
      for (trace::StallRow& st : sd.stalls)
        st.needed = oracle->needed(st.layer, st.kv_head, st.token);
    } else {
      sd = recorder.finish_step(ev.pos0, ids, ev.prefill, sampled, feeds_forced);
    }
    mark_roles(&sd, req);
    result.peak_kv_bytes = std::max(result.peak_kv_bytes, sd.step.kv_bytes);
    result.final_entries = sd.step.entries;
    result.final_kv_bytes = sd.step.kv_bytes;
    if (writer) writer->append_step(sd);
    ++result.steps;
    if (req.progress) req.progress({ev.pos0 + ev.n, max_tokens, result.steps});
  };

  generate::Generator generator(*engine.model, driver, engine.tokenizer.get());
  generate::GenerationOptions g = req.generation;
  if (g.max_positions <= 0) g.max_positions = max_positions;
  g.side_passes = std::move(side_passes);
  // Inserted tokens sit where the reconstruction would start: the side
  // passes run after them.
  g.side_passes_at = inserted > 0 ? inserted_at : pi.policy->reconstruction_at();
  if (inserted > 0) {
    g.inserted_model = pi.policy->inserted_model();
    g.inserted_at = inserted_at;
    g.inserted = inserted;
    if (!g.inserted_model)
      throw std::logic_error("run_capture: the policy inserts tokens but has no model for them");
  }
  // On an exception the writer's destructor flushes what was captured and
  // leaves complete = 0.
  result.generation = generator.run(req.prompt_ids, g, {}, on_step);
  result.policy_seconds = driver.policy_seconds();
  std::vector<std::string> where{attention_note(engine.device, req.device_prefill, driver, "")};
  if (oracle)
    where.push_back(attention_note(engine.device, req.device_prefill, oracle->driver(),
                                   "the oracle's full cache: "));
  for (const std::string& note : where)
    if (!note.empty()) result.notes.push_back(note);
  result.decode_policy_seconds =
      decode_policy_start < 0 ? 0 : driver.policy_seconds() - decode_policy_start;
  if (!req.expected_answers.empty()) {
    result.answers_found = tasks::answers_found(req.expected_answers, result.generation.text);
    result.success = result.answers_found == int64_t(req.expected_answers.size());
    result.score = tasks::answer_score(req.expected_answers, result.generation.text);
  } else if (!req.expected_answer.empty()) {
    result.success = result.generation.text.find(req.expected_answer) != std::string::npos;
    result.answers_found = result.success ? 1 : 0;
    result.score = result.success ? 1.0 : 0.0;
  }
  if (writer) {
    trace::GenerationSummary summary;
    const std::string& fr = result.generation.finish_reason;
    summary.finish_reason = fr == "context" ? "length" : fr;
    summary.success = req.expected_answer.empty() ? -1 : (result.success ? 1 : 0);
    if (!req.expected_answer.empty()) summary.score = result.score;
    writer->close(summary);
  }
  return result;
}

}  // namespace kvscope::recorder
