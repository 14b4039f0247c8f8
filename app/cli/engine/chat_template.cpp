// kvscope chat-template --model M | --template FILE --messages MSGS.json
//   [--no-generation-prompt] [--var NAME=VALUE ...] [--bos TEXT] [--eos TEXT]
// Prints exactly the text the model would be given (no newline added): the
// model's own chat template (or FILE) rendered as transformers'
// apply_chat_template(..., tokenize=False) renders it. docs/tokenizers.md
#include <iostream>
#include <memory>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/engine.h"
#include "capture/model/model_loader.h"
#include "capture/tokenizer/chat_template.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct ChatTemplateOptions {
  std::string model;
  std::string tokenizer;
  std::string template_file;
  std::string messages;
  bool no_generation_prompt = false;
  std::vector<std::string> vars;
  std::string bos, eos;
  bool bos_given = false, eos_given = false;
};

// The template and the special tokens: the model's tokenizer's, with
// --template, --bos and --eos taking precedence.
tokenizer::ChatTemplate chosen_template(const ChatTemplateOptions& o, tokenizer::ChatRequest* r) {
  tokenizer::ChatTemplate t;
  if (!o.model.empty()) {
    const model::ModelFileInfo info = model::inspect_model(o.model);
    std::string source;
    auto tok = generate::open_tokenizer(o.model, info.format, o.tokenizer, info.config.vocab_size,
                                        &source);
    if (!tok) throw InputError(o.model, "--tokenizer", "no tokenizer: " + source);
    t = tok->chat_template_with_origin();
    r->bos_token = tok->chat_bos_token();
    r->eos_token = tok->chat_eos_token();
  }
  if (!o.template_file.empty()) t = tokenizer::read_chat_template_file(o.template_file);
  if (t.source.empty())
    throw InputError(o.model, "chat_template",
                     "this model has no chat template (give one with --template FILE)");
  if (o.bos_given) r->bos_token = o.bos;
  if (o.eos_given) r->eos_token = o.eos;
  return t;
}

int run_chat_template(const ChatTemplateOptions& o) {
  if (o.model.empty() && o.template_file.empty())
    throw InputError("", "--model", "give --model M or --template FILE");
  tokenizer::ChatRequest r = tokenizer::read_chat_messages(o.messages);
  const tokenizer::ChatTemplate t = chosen_template(o, &r);
  r.add_generation_prompt = !o.no_generation_prompt;
  for (const std::string& spec : o.vars) tokenizer::add_chat_var(spec, "--var", &r.vars);
  std::vector<std::string> warnings;
  const std::string text = tokenizer::render_chat(t, r, &warnings);
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
  std::cout << text << std::flush;
  return kExitOk;
}

Command add_chat_template_command(CLI::App& app) {
  auto opt = std::make_shared<ChatTemplateOptions>();
  CLI::App* sub = app.add_subcommand("chat-template", engine_summary("chat-template"));
  auto* model = sub->add_option("--model", opt->model, "model whose chat template to use")
                    ->check(CLI::ExistingPath);
  sub->add_option("--tokenizer", opt->tokenizer, "tokenizer to read instead of the model's own")
      ->check(CLI::ExistingFile)
      ->needs(model);
  sub->add_option("--template", opt->template_file, "a Jinja chat template file (overrides)")
      ->check(CLI::ExistingFile);
  sub->add_option("--messages", opt->messages,
                  "JSON: a list of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_flag("--no-generation-prompt", opt->no_generation_prompt,
                "leave out the assistant prefix (add_generation_prompt = false)");
  sub->add_option("--var", opt->vars, "template variable NAME=JSON (enable_thinking=false)");
  sub->add_option("--bos", opt->bos, "bos_token's text (default: the model's)")
      ->each([opt](const std::string&) { opt->bos_given = true; });
  sub->add_option("--eos", opt->eos, "eos_token's text (default: the model's)")
      ->each([opt](const std::string&) { opt->eos_given = true; });
  return {sub, [opt] { return run_chat_template(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("chat-template", add_chat_template_command);

}  // namespace kvscope::cli
