// DuoAttention's head-pattern optimisation (duo_attention_training.h).
#include "capture/train/duo_attention_training.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "capture/model/transformer.h"
#include "capture/train/gated_attention.h"
#include "capture/train/kvzip_targets.h"
#include "capture/train/trainers.h"
#include "core/common/atomic_file.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The official MultiplePasskeyRetrievalDataset's alphabet and ordinals.
const char* const kWords[] = {
    "alpha",   "bravo", "charlie", "delta",  "echo",     "foxtrot", "golf",   "hotel",  "india",
    "juliett", "kilo",  "lima",    "mike",   "november", "oscar",   "papa",   "quebec", "romeo",
    "sierra",  "tango", "uniform", "victor", "whiskey",  "xray",    "yankee", "zulu"};
const char* const kOrdinals[] = {
    "first",     "second",    "third",       "fourth",     "fifth",      "sixth",      "seventh",
    "eighth",    "ninth",     "tenth",       "eleventh",   "twelfth",    "thirteenth", "fourteenth",
    "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth"};
constexpr int64_t kMaxPasskeys = 20;

// Mixed attention (§3.2): each kv head's output is alpha times its causal
// attention plus (1 - alpha) times its streaming attention, where query i
// sees the `sinks` first positions and positions i - recent .. i (the same
// set duo_attention's streaming heads see). An undefined alpha gives plain
// causal attention: the teacher. Whole sequences at position 0 only, on
// the model's device (alpha lives there too).
class DuoMixBackend : public model::AttentionBackend {
 public:
  DuoMixBackend(torch::Tensor alpha, int64_t sinks, int64_t recent, torch::Device device)
      : alpha_(std::move(alpha)), sinks_(sinks), recent_(recent), device_(device) {}

  void begin_step(int64_t pos0, int64_t n) override {
    TORCH_CHECK(pos0 == 0, "the duo-attention trainer feeds whole sequences at position 0");
    const auto on = torch::TensorOptions().device(device_);
    torch::Tensor i = torch::arange(n, on.dtype(torch::kInt64)).unsqueeze(1),
                  j = torch::arange(n, on.dtype(torch::kInt64)).unsqueeze(0);
    torch::Tensor seen = (j < sinks_).logical_or(j >= i - recent_);
    bias_ =
        torch::zeros({1, n, n}, on.dtype(torch::kFloat32))
            .masked_fill(seen.logical_not().unsqueeze(0), -std::numeric_limits<float>::infinity());
  }

  torch::Tensor attend(const model::AttentionInputs& in) override {
    torch::Tensor full = dense_attention(in.q, in.k, in.v, in.scale, in.sliding_window, {}, {});
    if (!alpha_.defined()) return full;
    const int64_t n = in.q.size(0), K = in.k.size(1), R = in.q.size(1) / K;
    torch::Tensor stream =
        dense_attention(in.q, in.k, in.v, in.scale, in.sliding_window, bias_.expand({K, n, n}), {});
    torch::Tensor a = alpha_[in.layer].repeat_interleave(R).view({1, K * R, 1}).to(full.dtype());
    return a * full + (1 - a) * stream;
  }

 private:
  torch::Tensor alpha_, bias_;
  int64_t sinks_, recent_;
  torch::Device device_;
};

// A --gate value as the user wrote it (numbers without a trailing ".0").
std::string shown(const json& v) {
  if (!v.is_number()) return v.dump();
  std::ostringstream out;
  out << v.get<double>();
  return out.str();
}

std::string with_ordinal(const char* before, int64_t p, const char* after) {
  std::string s(before);
  s.append(kOrdinals[p]).append(after);
  return s;
}

int64_t int_setting(const json& given, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!given.contains(key)) return def;
  const json& v = given.at(key);
  const double x = v.is_number() ? v.get<double>() : std::nan("");
  if (!(x >= double(lo) && x <= double(hi)) || x != std::floor(x))
    throw InputError("", "--gate " + std::string(key),
                     "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "] expected, got " + shown(v));
  return int64_t(x);
}

std::vector<int64_t> as_int64(const std::vector<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// mean over the answer tokens of mean_D (h_full - h_mixed)^2 (the official
// distill_loss); the teacher runs without autograd.
torch::Tensor distill_loss(model::Transformer& m, const DuoSample& s, DuoMixBackend& teacher,
                           DuoMixBackend& student) {
  torch::Tensor ids = torch::tensor(as_int64(s.ids), torch::kInt64);
  const int64_t n = ids.size(0), a = s.answer_from;
  torch::Tensor h_full;
  {
    torch::NoGradGuard no_grad;
    h_full = m.forward_hidden(ids, 0, teacher).narrow(0, a, n - a).to(torch::kFloat32);
  }
  torch::Tensor h_mix = m.forward_hidden(ids, 0, student).narrow(0, a, n - a).to(torch::kFloat32);
  return (h_full - h_mix).pow(2).mean(-1).mean();
}

// The official schedule: min(1, max((i+1)/(N/5), 0.1), max((N-i)/(N/5), 0.1)).
double trapezoid(int64_t i, int64_t n) {
  const double fifth = std::max<double>(1.0, double(n / 5));
  return std::min(
      {1.0, std::max(double(i + 1) / fifth, 0.1), std::max(double(n - i) / fifth, 0.1)});
}

// 0/1 gates: the round(sparsity * L * K) lowest of alpha stream (0), ties by
// (layer, head) order as duo_attention's sparsity rule; reversed: the
// highest stream instead. Ranked on the host, returned on alpha's device.
torch::Tensor hard_pattern(const torch::Tensor& alpha, double sparsity, bool reversed) {
  torch::Tensor flat = alpha.detach().flatten().to(torch::kCPU, torch::kFloat32).contiguous();
  const float* v = flat.data_ptr<float>();
  std::vector<int64_t> order(size_t(flat.numel()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return reversed ? v[x] > v[y] : v[x] < v[y]; });
  torch::Tensor out = torch::ones_like(flat);
  const int64_t n_stream = std::llround(double(flat.numel()) * sparsity);
  for (int64_t i = 0; i < n_stream; ++i) out[order[size_t(i)]] = 0.0f;
  return out.view(alpha.sizes()).to(alpha.device());
}

std::string pattern_tsv(const torch::Tensor& alpha) {
  torch::Tensor a = alpha.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  std::ostringstream out;
  out.precision(9);
  for (int64_t l = 0; l < a.size(0); ++l) {
    for (int64_t h = 0; h < a.size(1); ++h) out << (h ? "\t" : "") << a[l][h].item<double>();
    out << "\n";
  }
  return out.str();
}

void check_output_dir(const std::string& dir) {
  if (dir.empty()) throw InputError("", "-o", "an output directory is required (duo-attention)");
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw InputError(dir, "-o",
                     "exists and is not a directory (duo-attention writes a pattern "
                     "directory: full_attention_heads.tsv and config.json)");
  const fs::path parent = fs::absolute(dir).parent_path();
  if (!fs::is_directory(parent))
    throw InputError(dir, "-o", "the directory " + parent.string() + " does not exist");
}

}  // namespace

DuoTrainSettings duo_train_settings(const TrainOptions& o) {
  const json& g = o.hyper_given;
  for (const auto& [key, value] : g.items())
    if (key != "sinks" && key != "recent" && key != "passkeys" && key != "words" && key != "reg")
      throw InputError("", "--gate " + key,
                       "not a duo-attention key (sinks, recent, passkeys, words, reg)");
  DuoTrainSettings s;
  s.sinks = int_setting(g, "sinks", s.sinks, 0, int64_t(1) << 20);
  s.recent = int_setting(g, "recent", s.recent, 1, int64_t(1) << 20);
  s.passkeys = int_setting(g, "passkeys", s.passkeys, 1, kMaxPasskeys);
  s.words = int_setting(g, "words", s.words, 1, 1024);
  if (g.contains("reg")) {
    const json& v = g.at("reg");
    s.reg = v.is_number() ? v.get<double>() : std::nan("");
    if (!(s.reg >= 0 && s.reg <= 1e6))
      throw InputError("", "--gate reg", "a number in [0, 1e6] expected, got " + shown(v));
  }
  return s;
}

DuoSample duo_passkey_sample(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& text,
                             int64_t start, int64_t seq_len, int64_t passkeys, int64_t words,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> word(0, 25);
  std::uniform_real_distribution<double> depth(0.05, 0.95);
  const std::vector<int32_t> sep = tok.encode("\n\n", false);
  const std::vector<int32_t> head = tok.encode("This is a very long document: <document> ", true);
  const std::vector<int32_t> tail = tok.encode(" </document>.\n\n", false);
  std::vector<std::vector<int32_t>> keys, needles, questions;
  int64_t fixed = int64_t(head.size() + tail.size());
  for (int64_t p = 0; p < passkeys; ++p) {
    std::string key;
    for (int64_t w = 0; w < words; ++w) {
      if (w) key += ' ';
      key += kWords[word(rng)];
    }
    keys.push_back(tok.encode(key, false));
    needles.push_back(tok.encode(
        with_ordinal("Remember this sequence of words, it's the ", p, " passkey to the vault: "),
        false));
    questions.push_back(
        tok.encode(with_ordinal("Based on the content of the document, what is the ", p,
                                " passkey to the vault?\nPasskey: "),
                   false));
    fixed += int64_t(2 * sep.size() + needles.back().size() + keys.back().size());  // the needle
    fixed += int64_t(questions.back().size() + keys.back().size() + sep.size());    // its answer
  }
  const int64_t filler = seq_len - fixed;
  if (filler < 16)
    throw InputError("", "--seq-len",
                     std::to_string(seq_len) + " tokens leave " + std::to_string(filler) +
                         " of text around " + std::to_string(passkeys) + " passkeys of " +
                         std::to_string(words) +
                         " words (at least 16 needed): raise --seq-len or lower --gate "
                         "passkeys / --gate words");
  TORCH_CHECK(start >= 0 && start + filler <= int64_t(text.size()), "text window out of range");
  std::vector<double> depths(static_cast<size_t>(passkeys));
  for (double& d : depths) d = depth(rng);
  std::sort(depths.begin(), depths.end());

  DuoSample s;
  auto put = [&](const std::vector<int32_t>& v) { s.ids.insert(s.ids.end(), v.begin(), v.end()); };
  put(head);
  int64_t at = 0;
  for (int64_t p = 0; p < passkeys; ++p) {
    const int64_t cut = int64_t(double(filler) * depths[size_t(p)]);
    s.ids.insert(s.ids.end(), text.begin() + start + at, text.begin() + start + cut);
    at = cut;
    put(sep);
    put(needles[size_t(p)]);
    put(keys[size_t(p)]);
    put(sep);
  }
  s.ids.insert(s.ids.end(), text.begin() + start + at, text.begin() + start + filler);
  put(tail);
  s.answer_from = int64_t(s.ids.size());
  for (int64_t p = 0; p < passkeys; ++p) {
    put(questions[size_t(p)]);
    put(keys[size_t(p)]);
    put(sep);
  }
  TORCH_CHECK(int64_t(s.ids.size()) == seq_len, "passkey sample length");
  return s;
}

namespace {

void check_duo_options(const TrainOptions& o) {
  check_output_dir(o.output);
  if (o.resume)
    throw InputError("", "--resume",
                     "duo-attention writes no checkpoint to resume from (run it again without "
                     "--resume)");
  if (!o.evaluate.empty())
    throw InputError("", "--evaluate",
                     "duo-attention has no held-out evaluation of a given pattern (its training "
                     "summary in config.json holds the held-out numbers)");
}

// The run's model, its text and the settings every phase reads.
struct DuoRun {
  const TrainOptions& o;
  DuoTrainSettings s;
  generate::Engine engine;
  TokenData data;
};

// alpha starts at 1 (every head retrieval), as the official initial_value,
// on the model's device with the optimiser's state (--device cuda). The
// distillation and |alpha| curves per step.
torch::Tensor optimise_alpha(DuoRun& run, std::vector<double>* curve,
                             std::vector<double>* reg_curve) {
  const TrainOptions& o = run.o;
  const DuoTrainSettings& s = run.s;
  model::Transformer& m = *run.engine.model;
  const model::ModelConfig& c = m.config();
  const torch::Device dev = m.device();
  torch::Tensor alpha = torch::ones({c.n_layers, c.n_kv_heads}, torch::TensorOptions().device(dev));
  alpha.requires_grad_(true);
  torch::optim::AdamW adam(std::vector<torch::Tensor>{alpha},
                           torch::optim::AdamWOptions(o.lr).weight_decay(0));
  DuoMixBackend teacher(torch::Tensor(), s.sinks, s.recent, dev),
      student(alpha, s.sinks, s.recent, dev);
  const int64_t train_windows = std::max<int64_t>(1, (run.data.train_end - o.seq_len) / o.seq_len);
  for (int64_t i = 0; i < o.steps; ++i) {
    {
      torch::NoGradGuard no_grad;
      alpha.clamp_(0, 1);
    }
    const int64_t start = kvzip_window_start(i % train_windows, o.seq_len, 0, run.data.train_end);
    const DuoSample smp = duo_passkey_sample(*run.engine.tokenizer, run.data.ids, start, o.seq_len,
                                             s.passkeys, s.words, o.seed * 1000003 + uint64_t(i));
    torch::Tensor distill = distill_loss(m, smp, teacher, student);
    torch::Tensor reg = alpha.abs().mean();
    torch::Tensor loss = distill + s.reg * reg;
    adam.zero_grad();
    loss.backward();
    for (auto& g : adam.param_groups())
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(o.lr * trapezoid(i, o.steps));
    adam.step();
    curve->push_back(distill.item<double>());
    reg_curve->push_back(reg.item<double>());
    if (!o.quiet && (i % 10 == 0 || i + 1 == o.steps))
      std::fprintf(stderr, "duo-attention: step %lld/%lld, distill %.6f, mean alpha %.4f\n",
                   (long long)i + 1, (long long)o.steps, curve->back(), reg_curve->back());
  }
  torch::NoGradGuard no_grad;
  alpha.clamp_(0, 1);
  return alpha;
}

// Held out: the hard pattern at sparsity 0.5 against the reversed ranking
// (the heads the training would keep made to stream instead); the mean
// distillation loss of each.
std::pair<double, double> heldout_distill(DuoRun& run, const torch::Tensor& alpha, int64_t held) {
  torch::NoGradGuard no_grad;
  const TrainOptions& o = run.o;
  const DuoTrainSettings& s = run.s;
  model::Transformer& m = *run.engine.model;
  const torch::Device dev = m.device();
  const torch::Tensor trained = hard_pattern(alpha, 0.5, false);
  const torch::Tensor reversed = hard_pattern(alpha, 0.5, true);
  DuoMixBackend teacher(torch::Tensor(), s.sinks, s.recent, dev);
  DuoMixBackend hard(trained, s.sinks, s.recent, dev), hard_rev(reversed, s.sinks, s.recent, dev);
  double held_trained = 0, held_reversed = 0;
  for (int64_t w = 0; w < held; ++w) {
    const int64_t start =
        kvzip_window_start(w, o.seq_len, run.data.train_end, int64_t(run.data.ids.size()));
    const DuoSample smp =
        duo_passkey_sample(*run.engine.tokenizer, run.data.ids, start, o.seq_len, s.passkeys,
                           s.words, ~(o.seed * 1000003 + uint64_t(w)));
    held_trained += distill_loss(m, smp, teacher, hard).item<double>();
    held_reversed += distill_loss(m, smp, teacher, hard_rev).item<double>();
  }
  return {held_trained / double(held), held_reversed / double(held)};
}

}  // namespace

// The phases: options, model and text; alpha's optimisation; the held-out
// check; the pattern and its config written.
TrainResult train_duo_attention(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_duo_options(o);
  DuoRun run{o, duo_train_settings(o), generate::open_engine(o.model), {}};
  if (!run.engine.tokenizer)
    throw InputError("--tokenizer", "",
                     "duo-attention needs the model's tokenizer for its "
                     "passkey samples");
  DataOptions d = o.data;
  d.window = o.seq_len;
  d.seed = o.seed;
  run.data = load_training_data(run.engine, d);
  const DuoTrainSettings& s = run.s;
  const model::ModelConfig& c = run.engine.model->config();
  // The first sample checks that --seq-len holds the passkeys.
  duo_passkey_sample(*run.engine.tokenizer, run.data.ids, 0, o.seq_len, s.passkeys, s.words, 0);
  std::vector<double> curve, reg_curve;
  const torch::Tensor alpha = optimise_alpha(run, &curve, &reg_curve);
  const int64_t held = std::max<int64_t>(1, o.eval_windows);
  const auto [held_trained, held_reversed] = heldout_distill(run, alpha, held);

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json training = {
      {"method",
       "DuoAttention's optimisation: alpha mixes each kv head's full and streaming attention; "
       "loss = mean over the answer tokens of mean_D (h_full - h_mixed)^2 + reg * mean |alpha| "
       "on synthetic multi-passkey retrieval samples; AdamW (no weight decay), trapezoid "
       "schedule, alpha clamped to [0, 1]"},
      {"data", run.data.describe},
      {"steps", o.steps},
      {"seq_len", o.seq_len},
      {"lr", o.lr},
      {"passkeys", s.passkeys},
      {"words", s.words},
      {"reg", s.reg},
      {"distill", curve},
      {"mean_alpha", reg_curve},
      {"heldout_windows", held},
      {"heldout_distill_sparsity_0.5", held_trained},
      {"heldout_distill_sparsity_0.5_reversed", held_reversed},
      {"seed", o.seed},
      {"device", run.engine.model->device().str()},
      {"command", o.command_line},
      {"wall_seconds", wall}};
  json config = {{"sink_size", s.sinks},
                 {"recent_size", s.recent},
                 {"format", "duo-attention head pattern (official layout)"},
                 {"base_model", model_json(c, c.name, o.model.model, o.model.model)},
                 {"training", training}};
  fs::create_directories(o.output);
  write_file_atomically((fs::path(o.output) / "full_attention_heads.tsv").string(),
                        pattern_tsv(alpha), "the head pattern");
  write_file_atomically((fs::path(o.output) / "config.json").string(), config.dump(2) + "\n",
                        "the pattern's config");
  TrainResult r;
  r.summary = training;
  r.wall_seconds = wall;
  return r;
}

TrainerDescriptor duo_attention_trainer() {
  return {"duo-attention",
          "DuoAttention's head pattern: each head's full/streaming mix optimised on passkey "
          "samples",
          "Xiao et al., DuoAttention: Efficient Long-Context LLM Inference with Retrieval and "
          "Streaming Heads, ICLR 2025",
          "docs/policies/duo_attention.md",
          TrainInput::Text,
          TrainOutput::Directory,
          "-o a pattern directory: full_attention_heads.tsv and config.json",
          "sinks, recent, passkeys, words, reg",
          {},
          [](TrainOptions o, const Params&) { return train_duo_attention(o); }};
}

}  // namespace kvscope::gates
