// The methods the gated-attention trainer runs (gated_trainer.h): each one's
// descriptor, and the settings it reads from its own options.
#include "capture/train/gated_trainer.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

constexpr double kMaxWeight = 1e6;

const char* const kGatedWrites =
    "-o the gate file (.safetensors) + .json metadata, .log, .csv loss curve, .ckpt to --resume";

// The gate kind fixed by the method, then the trainer.
TrainerDescriptor::Run gated_run(GateKind kind, GatedSettings (*settings)(const Params&)) {
  return [kind, settings](TrainOptions o, const Params& p) {
    o.kind = kind;
    return train_gated(o, settings(p));
  };
}

GatedSettings no_settings(const Params&) {
  return {};
}

GatedSettings retention_settings(const Params& p) {
  GatedSettings s;
  s.budget = p.get_float("budget");
  s.cap_weight = p.get_float("cap_weight");
  s.ce_weight = p.get_float("ce_weight");
  return s;
}

std::vector<ParamSpec> retention_options() {
  return {{"budget", ParamType::Float, "0", "capacity M in tokens per head (0: --seq-len / 4)", 0,
           double(int64_t(1) << 26)},
          {"cap_weight", ParamType::Float, "1", "weight of the capacity hinge", 0, kMaxWeight},
          {"ce_weight", ParamType::Float, "1", "weight of the next-token cross-entropy", 0,
           kMaxWeight}};
}

// KVpop's scorer and loss (seed 003 eq. 2, 7, 23, 24; App. B).
GatedSettings kvpop_settings(const Params& p) {
  GatedSettings s;
  const std::string lse = p.get_string("target_lse"), agg = p.get_string("target_agg");
  if (lse != "sparse" && lse != "dense")
    throw InputError("", "--target-lse", "'" + lse + "' (expected sparse or dense)");
  if (agg != "max" && agg != "mean")
    throw InputError("", "--target-agg", "'" + agg + "' (expected max or mean)");
  KvpopLossOptions& k = s.kvpop;
  k.dense_lse = lse == "dense";
  k.target.agg = agg == "max" ? kvpop::TargetOptions::Max : kvpop::TargetOptions::Mean;
  k.max_pairs = p.get_int("pairs");
  k.tau = p.get_float("loss_tau");
  k.margin_weighting = !p.get_bool("no_margin_weighting");
  k.target.count_normalise = !p.get_bool("no_count_normalise");
  k.balance = !p.get_bool("no_balance");
  s.kl_topk = p.get_int("kl_topk");
  s.base_lr = p.get_float("base_lr");
  s.model_out = p.get_string("model_out");
  if (p.get_bool("retrofit")) s.base = GatedSettings::Base::Retrofit;
  return s;
}

ParamSpec kl_topk_option() {
  return {
      "kl_topk", ParamType::Int,
      "256",     "teacher logits of the KL (reported; the loss with --retrofit and streaming-plus)",
      1,         double(int64_t(1) << 30)};
}

ParamSpec base_lr_option() {
  return {"base_lr", ParamType::Float,
          "8e-05",   "constant learning rate of the base weights (--retrofit, streaming-plus)",
          1e-12,     10};
}

GateKind kvpop_kind(const Params& p) {
  const std::string scorer = p.get_string("scorer");
  if (scorer != "mlp" && scorer != "mlstm")
    throw InputError("", "--scorer", "'" + scorer + "' (expected mlp or mlstm)");
  return scorer == "mlp" ? GateKind::KvpopMlp : GateKind::KvpopMlstm;
}

// StreamingLLM+ has no scorer: its budget is KVpop's (--gate sinks, window,
// topk; the pattern's window is w + k), carried by a kvpop-mlp gate set that
// is never trained or written.
void check_streaming_plus_keys(const TrainOptions& o) {
  for (const auto& [key, value] : o.hyper_given.items())
    if (key != "sinks" && key != "window" && key != "topk")
      throw InputError("", "--gate",
                       "'" + key +
                           "' is not a setting of streaming-plus (expected sinks, window, topk: "
                           "the budget, as for kvpop)");
}

}  // namespace

TrainerDescriptor wgkv_trainer() {
  return {"wgkv",
          "WG-KV write gates: L2 distillation of the final hidden states + lambda * sparsity",
          "seed 000 (WG-KV) §3.3",
          "docs/policies/wgkv.md",
          TrainInput::Text,
          TrainOutput::File,
          kGatedWrites,
          hyper_keys({GateKind::WriteGate}),
          {{"lambda", ParamType::Float, "0.04", "weight of the sparsity loss mean(g + g(1-g))", 0,
            kMaxWeight}},
          gated_run(GateKind::WriteGate, [](const Params& p) {
            GatedSettings s;
            s.lambda = p.get_float("lambda");
            return s;
          })};
}

TrainerDescriptor attention_gate_trainer() {
  return {"attention-gate",
          "Attention-Gate flags: KL to the frozen model + alpha * |mean(flags) - beta|",
          "seed 001 (Attention-Gate) §3.5",
          "docs/policies/attention_gate.md",
          TrainInput::Text,
          TrainOutput::File,
          kGatedWrites,
          hyper_keys({GateKind::AttentionGate}),
          {{"alpha", ParamType::Float, "5", "weight of the eviction loss", 0, kMaxWeight},
           {"beta", ParamType::Float, "0.4", "target share of kept tokens", 0, 1}},
          gated_run(GateKind::AttentionGate, [](const Params& p) {
            GatedSettings s;
            s.alpha = p.get_float("alpha");
            s.beta = p.get_float("beta");
            return s;
          })};
}

TrainerDescriptor retention_trainer() {
  return {"retention",
          "TrimKV retention gates: KL + CE + a capacity hinge per head",
          "seed 002 (globally calibrated retention gates) §2.2",
          "docs/policies/trimkv.md",
          TrainInput::Text,
          TrainOutput::File,
          kGatedWrites,
          hyper_keys({GateKind::Retention}),
          retention_options(),
          gated_run(GateKind::Retention, retention_settings)};
}

TrainerDescriptor retention_global_trainer() {
  return {"retention-global",
          "DBTrimKV retention gates: as retention, with one global capacity hinge",
          "seed 002 (globally calibrated retention gates) §4.1",
          "docs/policies/dbtrimkv.md",
          TrainInput::Text,
          TrainOutput::File,
          kGatedWrites,
          hyper_keys({GateKind::RetentionGlobal}),
          retention_options(),
          gated_run(GateKind::RetentionGlobal, retention_settings)};
}

TrainerDescriptor kvpop_trainer() {
  return {
      "kvpop",
      "KVpop eviction scorers: the boundary-aware loss against the future-attention target",
      "seed 003 (KVpop) eq. 2, 7, 23, 24; Algorithm 1 with --retrofit",
      "docs/policies/kvpop.md",
      TrainInput::Text,
      TrainOutput::File,
      std::string(kGatedWrites) + "; --retrofit also the fine-tuned model (--model-out)",
      hyper_keys({GateKind::KvpopMlp, GateKind::KvpopMlstm}),
      {{"scorer", ParamType::String, "mlstm", "the scorer, mlstm or mlp"},
       {"target_lse", ParamType::String, "sparse",
        "normalisers of the future-attention target, sparse (the paper's) or dense (exact)"},
       {"target_agg", ParamType::String, "max",
        "aggregation over a group's query heads, max or mean"},
       {"no_count_normalise", ParamType::Bool, "false",
        "total future mass instead of the mean over the future queries (eq. 2; App. B.2)"},
       {"pairs", ParamType::Int, "0",
        "boundary pairs sampled per head and layer (0: every saturated query)", 0,
        double(int64_t(1) << 30)},
       {"loss_tau", ParamType::Float, "1", "temperature of the boundary loss (eq. 7)", 1e-12,
        kMaxWeight},
       {"no_margin_weighting", ParamType::Bool, "false", "no margin weights (eq. 23)"},
       {"no_balance", ParamType::Bool, "false", "no keep/drop balancing (eq. 24)"},
       kl_topk_option(),
       {"retrofit", ParamType::Bool, "false",
        "the full retrofit, base and scorers together (Algorithm 1); Table 3's optimiser unless "
        "set: --lr 1e-3 --lr-min 8e-5 --warmup-steps 100 --weight-decay 1e-4 --beta2 0.95 "
        "--grad-clip 1 --base-lr 8e-5"},
       {"model_out", ParamType::String, "",
        "--retrofit: the fine-tuned model to write (default: -o with .bin, or a directory for HF "
        "models)"},
       base_lr_option()},
      [](TrainOptions o, const Params& p) {
        o.kind = kvpop_kind(p);
        const GatedSettings s = kvpop_settings(p);
        apply_table3_defaults(o, s.base);
        return train_gated(o, s);
      }};
}

TrainerDescriptor streaming_plus_trainer() {
  return {"streaming-plus",
          "StreamingLLM+: the base fine-tuned under sinks + a window of KVpop's budget (no scorer)",
          "seed 003 (KVpop) §4",
          "docs/policies/kvpop.md",
          TrainInput::Text,
          TrainOutput::Checked,
          "-o the fine-tuned model (llama2.c .bin, or a directory for HF models) + .json, .log, "
          ".csv, .ckpt",
          "sinks, window, topk",
          {kl_topk_option(), base_lr_option()},
          [](TrainOptions o, const Params& p) {
            check_streaming_plus_keys(o);
            GatedSettings s;
            s.base = GatedSettings::Base::StreamingPlus;
            s.kl_topk = p.get_int("kl_topk");
            s.base_lr = p.get_float("base_lr");
            o.kind = GateKind::KvpopMlp;
            apply_table3_defaults(o, s.base);
            return train_gated(o, s);
          }};
}

TrainerDescriptor dms_trainer() {
  return {"dms",
          "DMS eviction decisions: distillation + a ramped compression target",
          "Łańcucki et al., Inference-Time Hyper-Scaling with KV Cache Compression (DMS), 2025",
          "docs/policies/dms_learned.md",
          TrainInput::Text,
          TrainOutput::File,
          kGatedWrites,
          hyper_keys({GateKind::Dms}),
          {},
          gated_run(GateKind::Dms, no_settings)};
}

}  // namespace kvscope::gates
