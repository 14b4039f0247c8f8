// kvscope capture --model M --policy P (--prompt|--prompt-file) [--max-new N]
//   [--capture LEVELS] [--oracle] -o run.kvtrace.h5
// Generate + record: the model runs under the policy on the ragged cache and
// every step goes into the trace. A progress bar on a terminal; a summary
// line at the end. The work happens in capture/recorder/capture_run.cpp.
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/engine_cli.h"
#include "capture/recorder/capture_run.h"
#include "capture/tasks/task_prompt.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct CaptureCliOptions {
  generate::ModelOptions model;
  generate::PromptCliOptions prompt;
  std::string policy = "full";
  std::string levels = "events";
  bool oracle = false;
  int64_t oracle_k = 16;
  std::string output;
  int64_t page_rows = 16;
  std::string device_prefill = "kernel";
  std::string expect;
  std::string task;
  std::string query = "auto";
  bool quiet = false;
  bool max_new_given = false;  // --max-new on the command line (else a task's own may apply)
};

void draw_progress(const recorder::CaptureProgress& p) {
  const int width = 40;
  double f = p.tokens_total > 0 ? double(p.tokens_done) / double(p.tokens_total) : 0;
  int fill = static_cast<int>(f * width);
  std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld tokens, %lld steps", fill,
               "########################################", width - fill, "",
               static_cast<long long>(p.tokens_done), static_cast<long long>(p.tokens_total),
               static_cast<long long>(p.steps));
  std::fflush(stderr);
}

int run_capture_cli(const CaptureCliOptions& o) {
  generate::Engine engine = generate::open_engine(o.model);
  if (!engine.tokenizer)
    throw InputError(o.model.model, "--tokenizer", "no tokenizer: " + engine.tokenizer_source);
  generate::configure_chat(*engine.tokenizer, o.prompt);
  recorder::CaptureRequest req;
  req.generation = generate::generation_options(o.prompt);
  if (!o.task.empty()) {
    if (!o.prompt.prompt.empty() || !o.prompt.prompt_file.empty())
      throw InputError("", "--task", "builds its own prompt: drop --prompt/--prompt-file");
    tasks::TaskPrompt task = tasks::build_task(o.task, *engine.tokenizer, o.prompt.chat);
    tasks::apply_query_protocol(&task, o.query, *engine.tokenizer);
    recorder::set_task(task, &req);
    if (task.max_new > 0 && !o.max_new_given) req.generation.max_new_tokens = task.max_new;
  } else {
    if (o.query != "auto")
      throw InputError("", "--query", "places a task's question: it needs --task");
    req.prompt_text = generate::model_input_text(*engine.tokenizer, o.prompt);
    req.prompt_ids = engine.tokenizer->encode(req.prompt_text, /*add_special=*/true);
  }
  req.policy = o.policy;
  req.levels = o.levels;
  req.oracle = o.oracle;
  req.oracle_recall_k = o.oracle_k;
  req.output = o.output;
  req.model_path = o.model.model;
  req.tokenizer_path = o.model.tokenizer;
  req.page_rows = o.page_rows;
  req.device_prefill = o.device_prefill;
  req.command_line = own_command_line();
  if (!o.expect.empty()) {
    req.expected_answer = o.expect;
    req.expected_answers.clear();  // --expect replaces the task's answers
    if (req.task_kind.empty()) req.task_kind = "expected-answer";
  }
  nlohmann::json run = {{"prompt_user", o.task.empty() ? generate::prompt_text(o.prompt) : o.task},
                        {"chat", o.prompt.chat},
                        {"greedy", req.generation.sampling.greedy},
                        {"temperature", req.generation.sampling.temperature},
                        {"top_k", req.generation.sampling.top_k},
                        {"top_p", req.generation.sampling.top_p},
                        {"max_new", req.generation.max_new_tokens},
                        {"ignore_eos", !req.generation.stop_at_eos},
                        {"forced_tokens", req.generation.forced_tokens.size()},
                        {"prefill_chunk", req.generation.prefill_chunk},
                        {"page_rows", o.page_rows},
                        {"device_prefill", o.device_prefill},
                        {"threads", o.model.threads}};
  req.run_json = run.dump();
  const bool tty = !o.quiet && isatty(STDERR_FILENO);
  if (tty) req.progress = draw_progress;

  recorder::CaptureResult r = recorder::run_capture(engine, req);
  if (tty) std::fprintf(stderr, "\n");
  for (const std::string& note : r.notes) std::cerr << "kvscope: note: " << note << "\n";
  if (!o.quiet) std::cout << r.generation.text << "\n";
  // "expected answer found", or for several "expected answers: 3 of 4 found".
  std::string answers;
  if (!req.scorer.empty()) {
    char score[96];
    std::snprintf(score, sizeof score, " | %s score %.3f%s", req.scorer.c_str(), r.score,
                  r.success ? " (full)" : "");
    answers = score;
  } else if (req.expected_answers.size() > 1)
    answers = " | expected answers: " + std::to_string(r.answers_found) + " of " +
              std::to_string(req.expected_answers.size()) + " found" +
              (r.success ? "" : " (MISSING some)");
  else if (!req.expected_answer.empty())
    answers = r.success ? " | expected answer found" : " | expected answer MISSING";
  char line[512];
  std::snprintf(line, sizeof line,
                "capture: %lld steps, policy %s, %lld entries held at the end in %.1f KiB, peak "
                "%.1f KiB KV | "
                "prefill %.1f tokens/s, decode %.1f tokens/s, policy %.3f ms per decode step | "
                "finish: %s%s%s\n",
                static_cast<long long>(r.steps), o.policy.c_str(),
                static_cast<long long>(r.final_entries), double(r.final_kv_bytes) / 1024.0,
                double(r.peak_kv_bytes) / 1024.0, r.generation.prefill_tokens_per_second(),
                r.generation.decode_tokens_per_second(),
                r.generation.decode_steps > 0
                    ? 1e3 * r.decode_policy_seconds / double(r.generation.decode_steps)
                    : 0.0,
                r.generation.finish_reason.c_str(), answers.c_str(),
                o.levels == "none" ? "" : (" | trace: " + o.output).c_str());
  std::cerr << line;
  return kExitOk;
}

Command add_capture_command(CLI::App& app) {
  auto opt = std::make_shared<CaptureCliOptions>();
  CLI::App* sub = app.add_subcommand("capture", engine_summary("capture"));
  generate::add_model_options(sub, &opt->model);
  generate::add_prompt_options(sub, &opt->prompt);
  sub->add_option("--policy", opt->policy, "NAME[:key=value,...] (see `kvscope policies`)")
      ->capture_default_str();
  sub->add_option("--capture", opt->levels,
                  "none | events, received, pooled[:B], dense:L.H[,L.H], topk:K joined with '+'")
      ->capture_default_str();
  sub->add_flag("--oracle", opt->oracle,
                "run a full-cache shadow: KL, lost attention, top-k recall");
  sub->add_option("--oracle-k", opt->oracle_k, "k of the oracle's top-k recall")
      ->check(CLI::Range(int64_t(1), int64_t(1024)))
      ->capture_default_str();
  sub->add_option("--page-size", opt->page_rows, "tokens per KV page")
      ->check(CLI::Range(int64_t(1), int64_t(4096)))
      ->capture_default_str();
  sub->add_option("--device-prefill", opt->device_prefill,
                  "how prefill chunks are attended: kernel (with --device cuda the flash-style "
                  "CUDA kernel, on the CPU the host kernel) or blocked (query blocks of matrix "
                  "products, the statistics read off each block's weights; the same tensor code "
                  "on either device)")
      ->check(CLI::IsMember({"kernel", "blocked"}))
      ->capture_default_str();
  sub->add_option("--expect", opt->expect, "text a successful generation contains (task success)");
  sub->add_option(
      "--task", opt->task,
      "needle[:tokens=N,depth=D,seed=S]: passkey retrieval prompt with the needle marked; "
      "defer[:tokens=N,distract=D,seed=S,depth=X]: the pass key early, then D teacher-forced "
      "distractor decode steps and the forced question before the answer; "
      "niah[:tokens=N,keys=K,values=V,depth=D,seed=S,haystack=noise|text]: RULER's "
      "needle-in-a-haystack, K needles with distinct keys, one asked (keys=1: single-key; "
      "values=V: V values to find); "
      "vt[:tokens=N,chains=C,hops=H,depth=D,seed=S,haystack=noise|text]: RULER's variable "
      "tracking; cwe[:tokens=N,top=K,freq=F,rare=R,seed=S]: RULER's common words extraction "
      "dataset:file=F[,row=N,question=Q,scorer=S,tokens=T]: one row of a JSONL file in "
      "kvpress's schema, scored by S (string_match_all, string_match_part, substring, "
      "exact_match, f1, rouge_l, choice, boxed) "
      "(docs/tasks.md)");
  sub->add_option("--query", opt->query,
                  "where a task's question goes: inside (the prompt the policy compresses ends "
                  "with it, query-aware), after (fed after the compression as teacher-forced "
                  "decode steps, kvpress's default), auto (the task's own: after for dataset "
                  "rows, inside for the synthetic tasks)")
      ->check(CLI::IsMember({"auto", "after", "inside"}))
      ->capture_default_str();
  sub->add_option("-o,--output", opt->output, "trace file to write (.kvtrace.h5)");
  sub->add_flag("-q,--quiet", opt->quiet, "no progress bar and no generated text");
  return {sub, [opt, sub] {
            opt->max_new_given = sub->count("--max-new") > 0;
            if (opt->output.empty() && opt->levels != "none")
              throw InputError("", "-o", "an output trace path is required (or --capture none)");
            if (!opt->output.empty()) check_output_path(opt->output, "-o");
            return run_capture_cli(*opt);
          }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("capture", add_capture_command);

}  // namespace kvscope::cli
