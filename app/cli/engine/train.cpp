// kvscope train --policy NAME --model M [--data PATH... | --generate N]
//   [--seq-len L --steps N --lr X ...] [--gate key=value ...] [the method's
//   own options] [--resume] -o OUT
// kvscope train --list | --explain NAME
// Every trainer, its options, what it learns from and what it writes come
// from the trainer registry (capture/train/registry.h; docs/training.md):
// this file adds the shared options and one option per method option of
// any trainer, and refuses a method option the chosen trainer does not
// take. --device cuda runs every trainer where the model is
// (docs/training.md "On a GPU").
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/engine_cli.h"
#include "capture/train/registry.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct TrainCli {
  gates::TrainOptions o;
  std::string policy, explain;
  bool list = false;
  std::vector<std::string> gate_values;
  std::map<std::string, std::string> method_values;  // by ParamSpec name, as given
  CLI::App* sub = nullptr;
};

// "key=value" -> JSON number when it parses as one, else string.
nlohmann::json parse_gate_values(const std::vector<std::string>& items) {
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& kv : items) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("", "--gate", "'" + kv + "': key=value expected");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    char* end = nullptr;
    const double d = std::strtod(value.c_str(), &end);
    if (end && *end == '\0' && !value.empty())
      out[key] = d;
    else
      out[key] = value;
  }
  return out;
}

const gates::TrainerDescriptor& chosen_trainer(const TrainCli& c) {
  if (c.policy.empty())
    throw InputError("", "--policy", "a trainer is required (kvscope train --list lists them)");
  const gates::TrainerDescriptor* d = gates::find_trainer(c.policy);
  if (!d)
    throw InputError("", "--policy",
                     "'" + c.policy + "' is not a trainer (known: " + gates::trainer_names() + ")");
  return *d;
}

// The shared options the user set ("--lr"), for a method's own defaults.
std::set<std::string> given_options(const CLI::App* sub) {
  std::set<std::string> given;
  for (const CLI::Option* opt : sub->get_options())
    if (opt->count() > 0) given.insert(opt->get_name());
  return given;
}

void check_inputs(TrainCli& c, const gates::TrainerDescriptor& d) {
  if (d.input == gates::TrainInput::Text && c.o.model.model.empty())
    throw InputError("", "--model", "is required");
  if (d.output == gates::TrainOutput::File && c.o.evaluate.empty())
    check_output_path(c.o.output, "-o");
}

int print_list() {
  for (const gates::TrainerDescriptor& d : gates::builtin_trainers())
    std::printf("%-17s %s\n", d.name.c_str(), d.summary.c_str());
  return kExitOk;
}

int run_train(TrainCli& c) {
  if (c.list) return print_list();
  if (!c.explain.empty()) {
    c.policy = c.explain;
    std::printf("%s", gates::explain_trainer(chosen_trainer(c)).c_str());
    return kExitOk;
  }
  const gates::TrainerDescriptor& d = chosen_trainer(c);
  const gates::Params params = gates::trainer_params(d, c.method_values);
  check_inputs(c, d);
  c.o.command_line = own_command_line();
  c.o.hyper_given = parse_gate_values(c.gate_values);
  c.o.given = given_options(c.sub);
  const gates::TrainResult r = d.run(c.o, params);
  if (!c.o.evaluate.empty()) {
    std::printf("%s\n", r.summary.dump(2).c_str());
    return kExitOk;
  }
  const std::string model =
      r.model_file.empty() || r.model_file == c.o.output ? "" : " and the model " + r.model_file;
  std::fprintf(stderr, "train: %s wrote %s%s in %.1f s\n", d.name.c_str(), c.o.output.c_str(),
               model.c_str(), r.wall_seconds);
  return kExitOk;
}

// One command-line option per method option of any trainer (a Bool is a
// flag), its help naming the trainers that take it.
void add_method_options(CLI::App* sub, TrainCli* c) {
  std::set<std::string> added;
  for (const gates::TrainerDescriptor& d : gates::builtin_trainers())
    for (const gates::ParamSpec& p : d.options) {
      if (!added.insert(p.name).second) continue;
      const std::string flag = gates::option_flag(p),
                        help = gates::trainers_taking(p.name) + ": " + p.help;
      const std::string name = p.name;
      if (p.type == gates::ParamType::Bool) {
        sub->add_flag_function(
            flag, [c, name](int64_t) { c->method_values[name] = "true"; }, help);
        continue;
      }
      CLI::Option* opt = sub->add_option_function<std::string>(
          flag, [c, name](const std::string& v) { c->method_values[name] = v; }, help);
      if (!p.default_value.empty()) opt->default_str(p.default_value);
      if (p.type == gates::ParamType::Int)
        opt->check(CLI::Range(int64_t(p.min), int64_t(p.max)));
      else if (p.type == gates::ParamType::Float)
        opt->check(finite_range(p.min, p.max));
    }
}

void add_gate_option(CLI::App* sub, TrainCli* c) {
  std::string keys;
  for (const gates::TrainerDescriptor& d : gates::builtin_trainers())
    if (!d.gate_keys.empty()) keys += (keys.empty() ? "" : "; ") + d.name + ": " + d.gate_keys;
  sub->add_option("--gate", c->gate_values, "hyperparameter key=value (" + keys + ")");
}

// The text the windows come from.
void add_data_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--data", o.data.paths,
                  "plain-text files or directories (e.g. a Debian docs corpus)");
  sub->add_option("--generate", o.data.generate_tokens,
                  "add this many tokens of text the model generates itself")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 26))
      ->capture_default_str();
  sub->add_option("--generate-temperature", o.data.temperature,
                  "sampling temperature of generated text")
      ->check(finite_range(1e-4, 100))
      ->capture_default_str();
}

// Windows, steps and the optimiser.
void add_optimizer_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--seq-len", o.seq_len, "tokens per training window")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--steps", o.steps, "optimizer steps (one window each)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  sub->add_option("--batch", o.batch,
                  "windows (sfc: traces) per optimizer step, their gradients accumulated")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--lr", o.lr, "peak learning rate (AdamW, warmup then cosine)")
      ->check(finite_range(1e-12, 10))
      ->capture_default_str();
  sub->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->check(finite_range(0, 10))
      ->capture_default_str();
  sub->add_option("--warmup", o.warmup, "warmup share of the steps")
      ->check(finite_range(0, 1))
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the initialisation, data order and generated text")
      ->capture_default_str();
  sub->add_option("--lr-min", o.lr_min, "floor of the cosine decay")
      ->check(finite_range(0, 10))
      ->capture_default_str();
  sub->add_option("--warmup-steps", o.warmup_steps,
                  "warmup steps (instead of the --warmup share; -1: the share)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 30))
      ->capture_default_str();
  sub->add_option("--beta2", o.beta2, "AdamW's second beta")
      ->check(finite_range(0, 0.999999))
      ->capture_default_str();
  sub->add_option("--grad-clip", o.grad_clip, "clip the global gradient norm (0: no clipping)")
      ->check(finite_range(0, 1e6))
      ->capture_default_str();
}

// Evaluation, checkpoints, resuming and the output.
void add_run_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--eval-every", o.eval_every,
                  "evaluate on held-out text every N steps (0: at the end)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30))
      ->capture_default_str();
  sub->add_option("--eval-windows", o.eval_windows, "held-out windows per evaluation")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  sub->add_option("--checkpoint-every", o.checkpoint_every,
                  "write the resumable .ckpt every N steps")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30))
      ->capture_default_str();
  sub->add_flag("--resume", o.resume, "continue an interrupted run from its .ckpt (same options)");
  sub->add_option("--stop-after", o.stop_after,
                  "stop after N steps as if interrupted (to test --resume)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  sub->add_flag("-q,--quiet", o.quiet, "no progress lines on stderr (the .log still gets them)");
  sub->add_option("-o,--output", o.output,
                  "what to write: the gate file (.safetensors) or what the trainer's --explain "
                  "says");
  sub->add_option(
      "--evaluate", o.evaluate,
      "print the held-out numbers of this gate file as JSON instead of training (kvpop: "
      "at the budget --gate sinks/window/topk give; sfc: on --holdout, else --traces)");
}

Command add_train_command(CLI::App& app) {
  auto c = std::make_shared<TrainCli>();
  CLI::App* sub = app.add_subcommand("train", engine_summary("train"));
  c->sub = sub;
  sub->add_option("--policy", c->policy, "the trainer: " + gates::trainer_names());
  sub->add_flag("--list", c->list, "list the trainers");
  sub->add_option("--explain", c->explain,
                  "what a trainer learns, from what, its options and what it writes");
  generate::add_model_options(sub, &c->o.model);
  // sfc reads the model's path from its traces; the others need it.
  sub->get_option("--model")->required(false);
  add_data_options(sub, c.get());
  add_optimizer_options(sub, c.get());
  add_gate_option(sub, c.get());
  add_method_options(sub, c.get());
  add_run_options(sub, c.get());
  return {sub, [c] { return run_train(*c); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("train", add_train_command);

}  // namespace kvscope::cli
