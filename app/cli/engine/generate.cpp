// kvscope generate --model PATH (--prompt TEXT | --prompt-file F) [options]
// Streams the generated text to stdout and ends with the prefill and decode
// rates on stderr. The loading and the loop live in capture/generate.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/dense_kv_cache.h"
#include "capture/generate/engine.h"
#include "capture/generate/engine_cli.h"
#include "capture/generate/generator.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct GenerateOptions {
  generate::ModelOptions model;
  generate::PromptCliOptions prompt;
  bool echo = false;
  bool print_ids = false;
};

int run_generate(const GenerateOptions& o) {
  torch::NoGradGuard no_grad;
  generate::Engine engine = generate::open_engine(o.model);
  if (!engine.tokenizer)
    throw InputError(o.model.model, "--tokenizer", "no tokenizer: " + engine.tokenizer_source);
  generate::configure_chat(*engine.tokenizer, o.prompt);
  const std::vector<int32_t> ids = generate::prompt_ids(*engine.tokenizer, o.prompt);
  generate::GenerationOptions g = generate::generation_options(o.prompt);

  const model::ModelConfig& c = engine.model->config();
  // The cache holds what the run can reach: the prompt and the new tokens,
  // never more than the model's context (the Generator refuses a prompt that
  // leaves no room in it).
  g.max_positions =
      std::min<int64_t>(c.context_length, static_cast<int64_t>(ids.size()) + g.max_new_tokens);
  generate::DenseKvCache cache(c, g.max_positions, engine.device, engine.kv_dtype);
  generate::Generator generator(*engine.model, cache, engine.tokenizer.get());

  if (o.echo) std::cout << engine.tokenizer->decode(ids, /*skip_special=*/false) << std::flush;
  generate::GenerationResult r =
      generator.run(ids, g, [](const std::string& text) { std::cout << text << std::flush; });
  std::cout << "\n" << std::flush;
  if (o.print_ids) {
    std::cerr << "prompt ids:";
    for (int32_t id : r.prompt_ids) std::cerr << " " << id;
    std::cerr << "\noutput ids:";
    for (int32_t id : r.output_ids) std::cerr << " " << id;
    std::cerr << "\n";
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "prefill: %lld tokens, %.1f tokens/s | decode: %lld tokens, %.1f tokens/s | "
                "finish: %s\n",
                static_cast<long long>(r.prefill_tokens), r.prefill_tokens_per_second(),
                static_cast<long long>(r.decode_steps), r.decode_tokens_per_second(),
                r.finish_reason.c_str());
  std::cerr << line;
  return kExitOk;
}

Command add_generate_command(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", engine_summary("generate"));
  generate::add_model_options(sub, &opt->model);
  generate::add_prompt_options(sub, &opt->prompt);
  sub->add_flag("--echo", opt->echo, "print the prompt before the generated text");
  sub->add_flag("--print-ids", opt->print_ids, "print prompt and output token ids to stderr");
  return {sub, [opt] { return run_generate(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("generate", add_generate_command);

}  // namespace kvscope::cli
