// kvscope train --policy wgkv|attention-gate|retention|retention-global|kvpop
//   --model M --data PATH... [--generate N] --seq-len L --steps N [--lr X]
//   [--gate key=value ...] [objective weights] [--resume] -o gates.safetensors
// kvscope train --policy sfc --traces A,B [--holdout C] [--model M] --steps N
//   [--lr X] [--gate key=value ...] -o forecaster.safetensors
//   learns the Salience Forecasting Cache's forecaster from full-cache traces
//   (capture/train/sfc_trainer.cpp, docs/policies/sfc.md "Training").
// kvscope train --policy lukv --model M --data PATH --seq-len T --steps N
//   [--gate scorer=NAME,...] -o curve.npy
//   profiles LU-KV's budget curve (capture/train/lukv_profiling.h).
// --device cuda runs every trainer where the model is: the gates, the data
// windows and the optimiser state live on the model's device; sequential
// scans (KVpop's ranks, KVzip's selection, DuoAttention's hard pattern) and
// the small fits on recorded targets (kvzap, fastkvzip, the query
// calibrations) stay on the host (docs/training.md "On a GPU").
// Learns a seed paper's gates for a frozen model (capture/train/trainer.h,
// docs/training.md). Writes the gate file, its .json metadata, the .log and
// the .csv loss curve, and a .ckpt to --resume from. KVpop's fine-tuning
// settings also train the base and write it as a model file:
//   --policy kvpop --retrofit [--model-out M]   base + scorers (Algorithm 1)
//   --policy streaming-plus -o MODEL            StreamingLLM+: the base alone
//                                               under sinks + a window of w + k
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "app/cli/command.h"
#include "capture/generate/engine_cli.h"
#include "capture/train/duo_attention_training.h"
#include "capture/train/lukv_profiling.h"
#include "capture/train/trainer.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct TrainCli {
  gates::TrainOptions o;
  std::string policy;
  std::string scorer = "mlstm";  // --policy kvpop
  std::string target_lse = "sparse", target_agg = "max";
  bool no_margin = false, no_balance = false, no_count_normalise = false;
  bool retrofit = false;
  std::vector<std::string> gate_values;
  CLI::App* sub = nullptr;
};

// --retrofit and --policy streaming-plus fine-tune the base (seed 003 §4).
// StreamingLLM+ has no scorer: its budget is KVpop's (--gate sinks, window,
// topk; the pattern's window is w + k), carried by a kvpop-mlp gate set that
// is never trained or written.
void resolve_base_setting(TrainCli& c) {
  gates::TrainOptions& o = c.o;
  if (c.policy == "streaming-plus") {
    if (c.retrofit)
      throw InputError("", "--retrofit",
                       "streaming-plus fine-tunes the base already (expected --policy kvpop "
                       "--retrofit or --policy streaming-plus)");
    for (const std::string& kv : c.gate_values) {
      const std::string key = kv.substr(0, kv.find('='));
      if (key != "sinks" && key != "window" && key != "topk")
        throw InputError("", "--gate",
                         "'" + key +
                             "' is not a setting of streaming-plus (expected sinks, "
                             "window, topk: the budget, as for kvpop)");
    }
    o.base = gates::TrainOptions::Base::StreamingPlus;
    c.policy = "kvpop-mlp";
  } else if (c.retrofit) {
    o.base = gates::TrainOptions::Base::Retrofit;
  }
  std::set<std::string> given;
  for (const char* name :
       {"--lr", "--lr-min", "--warmup-steps", "--weight-decay", "--beta2", "--grad-clip"})
    if (c.sub->get_option(name)->count() > 0) given.insert(name);
  gates::apply_table3_defaults(o, given);
}

// --policy kvpop --scorer mlp|mlstm names the gate kinds kvpop-mlp / kvpop-mlstm.
void resolve_kvpop_options(TrainCli& c) {
  if (c.policy == "kvpop") {
    if (c.scorer != "mlp" && c.scorer != "mlstm")
      throw InputError("", "--scorer", "'" + c.scorer + "' (expected mlp or mlstm)");
    c.policy = "kvpop-" + c.scorer;
  }
  if (c.target_lse != "sparse" && c.target_lse != "dense")
    throw InputError("", "--target-lse", "'" + c.target_lse + "' (expected sparse or dense)");
  if (c.target_agg != "max" && c.target_agg != "mean")
    throw InputError("", "--target-agg", "'" + c.target_agg + "' (expected max or mean)");
  gates::KvpopLossOptions& k = c.o.kvpop;
  k.dense_lse = c.target_lse == "dense";
  k.target.agg =
      c.target_agg == "max" ? gates::kvpop::TargetOptions::Max : gates::kvpop::TargetOptions::Mean;
  if (k.max_pairs < 0) throw InputError("", "--pairs", "a count >= 0 expected");
  if (!(k.tau > 0)) throw InputError("", "--loss-tau", "a positive temperature expected");
  if (c.o.kl_topk < 1) throw InputError("", "--kl-topk", "a count >= 1 expected");
  k.margin_weighting = !c.no_margin;
  k.target.count_normalise = !c.no_count_normalise;
  k.balance = !c.no_balance;
}

// --policy sfc trains the sfc-gru forecaster from traces: --model is
// optional (the traces name it), the text options do not apply; the other
// kinds need --model and no traces.
void resolve_sfc_options(TrainCli& c) {
  const bool sfc = c.policy == "sfc" || c.policy == "sfc-gru";
  if (sfc) {
    c.policy = "sfc-gru";
    return;
  }
  for (const char* option : {"--traces", "--holdout", "--tokens", "--groups", "--bptt"})
    if (c.sub->get_option(option)->count() > 0)
      throw InputError("", option, "only --policy sfc trains from traces");
  if (c.o.model.model.empty()) throw InputError("", "--model", "is required");
}

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

// DuoAttention's pattern is a directory, not a gate file: its own trainer.
int run_train_duo(TrainCli& c) {
  c.o.command_line = own_command_line();
  c.o.hyper_given = parse_gate_values(c.gate_values);
  gates::TrainResult r = gates::train_duo_attention(c.o);
  std::fprintf(stderr,
               "train: wrote the pattern directory %s (full_attention_heads.tsv, config.json) in "
               "%.1f s\n",
               c.o.output.c_str(), r.wall_seconds);
  return kExitOk;
}

// LU-KV's budget curve is a .npy, not a gate file: its own profile.
int run_train_lukv(TrainCli& c) {
  check_output_path(c.o.output, "-o");
  c.o.command_line = own_command_line();
  c.o.hyper_given = parse_gate_values(c.gate_values);
  gates::TrainResult r = gates::profile_lukv(c.o);
  std::fprintf(stderr, "train: wrote the budget curve %s (+ .json) in %.1f s\n", c.o.output.c_str(),
               r.wall_seconds);
  return kExitOk;
}

int run_train(TrainCli& c) {
  if (c.policy == "duo-attention") return run_train_duo(c);
  if (c.policy == "lukv") return run_train_lukv(c);
  // StreamingLLM+'s -o is the model (an HF model's is a directory): the
  // trainer checks it.
  if (c.o.evaluate.empty() && c.policy != "streaming-plus") check_output_path(c.o.output, "-o");
  c.o.command_line = own_command_line();
  resolve_sfc_options(c);
  resolve_base_setting(c);
  resolve_kvpop_options(c);
  try {
    c.o.kind = gates::parse_gate_kind(c.policy, "", "--policy");
  } catch (const InputError& e) {  // the gate kinds, and the one trainer that writes no gates
    throw InputError("", "--policy",
                     std::string(e.what()).substr(std::string("--policy: ").size()) +
                         "; or duo-attention (a head pattern) or lukv (a budget curve)");
  }
  c.o.hyper_given = parse_gate_values(c.gate_values);
  gates::TrainResult r = gates::train_gates(c.o);
  if (!c.o.evaluate.empty()) {
    std::printf("%s\n", r.summary.dump(2).c_str());
    return kExitOk;
  }
  if (c.o.base == gates::TrainOptions::Base::StreamingPlus)
    std::fprintf(stderr, "train: wrote the model %s (+ .json .csv .log .ckpt) in %.1f s\n",
                 r.model_file.c_str(), r.wall_seconds);
  else if (c.o.kind == gates::GateKind::SfcGru)
    std::fprintf(stderr, "train: wrote %s (+ .json .csv .log) in %.1f s\n", c.o.output.c_str(),
                 r.wall_seconds);
  else if (c.o.kind == gates::GateKind::QFilter || c.o.kind == gates::GateKind::QueryStats ||
           c.o.kind == gates::GateKind::Kvzap || c.o.kind == gates::GateKind::FastKvzip ||
           c.o.kind == gates::GateKind::RestoreKv)
    std::fprintf(stderr, "train: wrote %s (+ .json) in %.1f s\n", c.o.output.c_str(),
                 r.wall_seconds);
  else
    std::fprintf(
        stderr, "train: wrote %s (+ .json .csv .log .ckpt)%s in %.1f s\n", c.o.output.c_str(),
        r.model_file.empty() ? "" : (" and the model " + r.model_file).c_str(), r.wall_seconds);
  return kExitOk;
}

// sfc: the traces it trains from and how they are sampled.
void add_sfc_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--traces", o.sfc.traces,
                  "sfc: full-cache traces (--policy full --capture received), comma-separated")
      ->delimiter(',')
      ->check(CLI::ExistingFile);
  sub->add_option("--holdout", o.sfc.holdout,
                  "sfc: held-out traces, evaluated and never trained on, comma-separated")
      ->delimiter(',')
      ->check(CLI::ExistingFile);
  sub->add_option("--tokens", o.sfc.tokens, "sfc: tokens sampled per trace and step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  sub->add_option("--groups", o.sfc.groups,
                  "sfc: (layer, kv head) groups sampled per trace and step (0: all)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->capture_default_str();
  sub->add_option("--bptt", o.sfc.bptt,
                  "sfc: truncate backpropagation through time every N steps (0: the whole trace)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->capture_default_str();
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
}

// Gate hyperparameters and the losses of wgkv, attention-gate and retention*.
void add_method_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option(
      "--gate", c->gate_values,
      "gate hyperparameter key=value (wgkv: window, tau, expand; attention-gate: heads, "
      "head_dim, tau, gamma; retention*: hidden, bias_init, activation; sfc: hidden, latent, "
      "horizon, ewma, tau_quantile, alpha, focal_gamma, lead, latency_weight; duo-attention: "
      "sinks, recent, passkeys, words, reg; lukv: scorer and its parameters, keep_first, "
      "keep_last, future)");
  sub->add_option("--lambda", o.lambda, "wgkv: weight of the sparsity loss mean(g + g(1-g))")
      ->check(finite_range(0, 1e6))
      ->capture_default_str();
  sub->add_option("--alpha", o.alpha, "attention-gate: weight of the eviction loss")
      ->check(finite_range(0, 1e6))
      ->capture_default_str();
  sub->add_option("--beta", o.beta, "attention-gate: target share of kept tokens")
      ->check(finite_range(0, 1))
      ->capture_default_str();
  sub->add_option("--budget", o.budget, "retention*: capacity M in tokens per head (0: seq-len/4)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 26))
      ->capture_default_str();
  sub->add_option("--cap-weight", o.cap_weight, "retention*: weight of the capacity hinge")
      ->check(finite_range(0, 1e6))
      ->capture_default_str();
  sub->add_option("--ce-weight", o.ce_weight, "retention*: weight of the next-token cross-entropy")
      ->check(finite_range(0, 1e6))
      ->capture_default_str();
}

// kvpop: the scorer, its target and its boundary loss.
void add_kvpop_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--scorer", c->scorer, "kvpop: the scorer, mlstm (default) or mlp");
  sub->add_option(
      "--target-lse", c->target_lse,
      "kvpop: normalisers of the future-attention target, sparse (the paper's) or dense (exact)");
  sub->add_option("--target-agg", c->target_agg,
                  "kvpop: aggregation over a group's query heads, max or mean");
  sub->add_flag(
      "--no-count-normalise", c->no_count_normalise,
      "kvpop: total future mass instead of the mean over the future queries (eq. 2; App. B.2)");
  sub->add_option("--pairs", o.kvpop.max_pairs,
                  "kvpop: boundary pairs sampled per head and layer (0: every saturated query)");
  sub->add_option("--loss-tau", o.kvpop.tau, "kvpop: temperature of the boundary loss (eq. 7)");
  sub->add_flag("--no-margin-weighting", c->no_margin, "kvpop: no margin weights (eq. 23)");
  sub->add_flag("--no-balance", c->no_balance, "kvpop: no keep/drop balancing (eq. 24)");
  sub->add_option("--kl-topk", o.kl_topk,
                  "kvpop: teacher logits of the KL (reported; the loss with --retrofit and "
                  "streaming-plus)");
  sub->add_flag("--retrofit", c->retrofit,
                "kvpop: the full retrofit, base and scorers together (Algorithm 1); Table 3's "
                "optimiser unless set: --lr 1e-3 --lr-min 8e-5 --warmup-steps 100 "
                "--weight-decay 1e-4 --beta2 0.95 --grad-clip 1 --base-lr 8e-5");
}

// --retrofit's model and the learning-rate schedule.
void add_schedule_options(CLI::App* sub, TrainCli* c) {
  gates::TrainOptions& o = c->o;
  sub->add_option("--model-out", o.model_out,
                  "--retrofit: the fine-tuned model to write (default: -o with .bin, or a "
                  "directory for HF models)");
  sub->add_option("--base-lr", o.base_lr,
                  "--retrofit, streaming-plus: constant learning rate of the base weights")
      ->check(finite_range(1e-12, 10))
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
                  "gate file to write (.safetensors; duo-attention: a pattern directory)");
  sub->add_option(
      "--evaluate", o.evaluate,
      "print the held-out numbers of this gate file as JSON instead of training (kvpop: "
      "at the budget --gate sinks/window/topk give; sfc: on --holdout, else --traces)");
}

Command add_train_command(CLI::App& app) {
  auto c = std::make_shared<TrainCli>();
  gates::TrainOptions& o = c->o;
  CLI::App* sub = app.add_subcommand(
      "train",
      "Train learned KV-cache gates (WG-KV, Attention-Gate, TrimKV/DBTrimKV, KVpop, SFC, DMS, "
      "RestoreKV, DuoAttention)");
  c->sub = sub;
  sub->add_option(
         "--policy", c->policy,
         "wgkv | attention-gate | retention | retention-global | kvpop (--scorer "
         "mlp|mlstm; --retrofit) | streaming-plus | sfc (--traces) | qfilter (calibration: "
         "--steps windows of --seq-len tokens of --data) | query-stats (calibration, likewise) | "
         "kvzap (KVzip+ scores of --data, ridge fit) | fastkvzip (KVzip scores of --data, "
         "gates by BCE) | dms (DMS eviction decisions: distillation + compression "
         "target) | restorekv (restore tokens + LoRA: self-distillation under KVzip's "
         "eviction) | duo-attention (head pattern: full/streaming mix on passkey samples; -o "
         "is a directory) | lukv (LU-KV budget curve: --steps windows of --seq-len context "
         "tokens, the scorer's order against the future's attention; -o is a .npy)")
      ->required();
  generate::add_model_options(sub, &o.model);
  // sfc reads the model's path from its traces.
  sub->get_option("--model")->required(false);
  add_sfc_options(sub, c.get());
  add_data_options(sub, c.get());
  add_optimizer_options(sub, c.get());
  add_method_options(sub, c.get());
  add_kvpop_options(sub, c.get());
  add_schedule_options(sub, c.get());
  add_run_options(sub, c.get());
  return {sub, [c] { return run_train(*c); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("train", add_train_command);

}  // namespace kvscope::cli
