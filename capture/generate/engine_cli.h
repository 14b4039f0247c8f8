// Command-line options shared by every command that runs a model
// (`kvscope generate`, `kvscope capture`): the model options and the
// generation options, registered on a CLI11 subcommand and turned into the
// engine's structs. Header-only so capture/ itself does not link CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "capture/generate/engine.h"
#include "capture/generate/generator.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"

namespace kvscope::generate {

// Bounds of the shared options (the model's own context bounds the prompt).
inline constexpr int kMaxThreads = 1024;
inline constexpr int64_t kMaxNewTokens = int64_t(1) << 24;

inline void add_model_options(CLI::App* app, ModelOptions* o) {
  app->add_option("--model", o->model,
                  "model: Hugging Face directory, .gguf file or llama2.c .bin checkpoint")
      ->required()
      ->check(CLI::ExistingPath);
  app->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json, llama2.c tokenizer.bin or .gguf (default: the model's own)")
      ->check(CLI::ExistingFile);
  // parse_device checks it (cuda:N against the machine's devices).
  app->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  app->add_option("--dtype", o->dtype, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app->add_option("--kv-dtype", o->kv_dtype,
                  "how the KV cache stores keys and values: fp32, bf16 or fp16 (default: the "
                  "--dtype of the weights; kernels accumulate in float32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app->add_option("--threads", o->threads,
                  "compute threads (0: OMP_NUM_THREADS if set, else one per core)")
      ->check(CLI::Range(0, kMaxThreads))
      ->capture_default_str();
}

// The prompt and sampling as typed on the command line.
struct PromptCliOptions {
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool chat = false;
  std::string chat_template;           // a template file replacing the model's
  std::vector<std::string> chat_vars;  // NAME=JSON template variables
  bool greedy = false;
  double temperature = 0;  // 0: not given
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t max_new = 256;
  int64_t prefill_chunk = 512;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

inline void add_prompt_options(CLI::App* app, PromptCliOptions* o) {
  auto* prompt = app->add_option("--prompt", o->prompt, "prompt text");
  auto* file = app->add_option("--prompt-file", o->prompt_file, "read the prompt from a file")
                   ->check(CLI::ExistingFile);
  prompt->excludes(file);
  app->add_flag("--chat", o->chat, "wrap the prompt in the model's chat template");
  app->add_option("--chat-template", o->chat_template,
                  "a Jinja chat template file to use instead of the model's")
      ->check(CLI::ExistingFile);
  app->add_option("--chat-var", o->chat_vars,
                  "chat template variable NAME=JSON (e.g. enable_thinking=false; repeatable)");
  app->add_option("--system", o->system, "system message for --chat");
  auto* greedy = app->add_flag("--greedy", o->greedy, "argmax decoding (the default)");
  auto* temp = app->add_option("--temperature", o->temperature, "sample at this temperature")
                   ->check(finite_range(1e-4, 100));
  auto* top_k = app->add_option("--top-k", o->top_k, "sample among the k most likely tokens")
                    ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  auto* top_p = app->add_option("--top-p", o->top_p, "sample from the nucleus of mass p")
                    ->check(finite_range(1e-6, 1));
  greedy->excludes(temp)->excludes(top_k)->excludes(top_p);
  app->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  app->add_option("--max-new", o->max_new, "most tokens to generate")
      ->check(CLI::Range(int64_t(1), kMaxNewTokens))
      ->capture_default_str();
  app->add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per forward pass")
      ->check(CLI::Range(int64_t(1), kMaxNewTokens))
      ->capture_default_str();
  app->add_option("--stop", o->stop, "stop before this text (repeatable)");
  app->add_flag(
      "--ignore-eos", o->ignore_eos,
      "keep generating past end-of-sequence tokens: exactly --max-new tokens (fixed-length "
      "runs: decode benchmarks, cross-checks)");
}

// The prompt text (from --prompt or --prompt-file); throws InputError.
inline std::string prompt_text(const PromptCliOptions& o) {
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) throw InputError(o.prompt_file, "--prompt-file", "cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  if (o.prompt.empty())
    throw InputError("", "--prompt", "a prompt is required (--prompt or --prompt-file)");
  return o.prompt;
}

inline GenerationOptions generation_options(const PromptCliOptions& o) {
  GenerationOptions g;
  g.max_new_tokens = o.max_new;
  g.prefill_chunk = o.prefill_chunk;
  g.stop_strings = o.stop;
  g.stop_at_eos = !o.ignore_eos;
  const bool sampling = o.temperature != 0 || o.top_k != 0 || o.top_p != 1.0;
  g.sampling.greedy = o.greedy || !sampling;
  g.sampling.temperature = o.temperature != 0 ? o.temperature : 1.0;
  g.sampling.top_k = o.top_k;
  g.sampling.top_p = o.top_p;
  g.sampling.seed = o.seed;
  return g;
}

// --chat-template and --chat-var on the tokenizer every chat prompt goes
// through (the prompt's, a task's, a policy's); either without --chat is an
// InputError.
inline void configure_chat(tokenizer::Tokenizer& tok, const PromptCliOptions& o) {
  if (!o.chat && !o.chat_template.empty())
    throw InputError("", "--chat-template", "only applies with --chat");
  if (!o.chat && !o.chat_vars.empty())
    throw InputError("", "--chat-var", "only applies with --chat");
  if (!o.chat_template.empty()) {
    const tokenizer::ChatTemplate t = tokenizer::read_chat_template_file(o.chat_template);
    tok.set_chat_template(t.source, t.origin);
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const std::string& spec : o.chat_vars) tokenizer::add_chat_var(spec, "--chat-var", &vars);
  if (!vars.empty() && !tok.chat_template().empty())
    for (const std::string& w : tokenizer::unread_chat_vars(tok.chat_template_with_origin(), vars))
      std::cerr << "warning: " << w << "\n";
  tok.set_chat_vars(std::move(vars));
}

// The text the model reads: the prompt as is, or wrapped in the chat
// template with --chat.
inline std::string model_input_text(const tokenizer::Tokenizer& tok, const PromptCliOptions& o) {
  std::string text = prompt_text(o);
  if (o.chat) {
    std::vector<tokenizer::ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", text});
    text = tok.apply_chat_template(messages);
  } else if (!o.system.empty()) {
    throw InputError("", "--system", "only applies with --chat");
  }
  return text;
}

// Prompt ids of model_input_text().
inline std::vector<int32_t> prompt_ids(const tokenizer::Tokenizer& tok, const PromptCliOptions& o) {
  return tok.encode(model_input_text(tok, o), /*add_special=*/true);
}

}  // namespace kvscope::generate
