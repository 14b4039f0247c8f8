#include "capture/generate/generator.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::generate {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Holds back text that might be the start of a stop string, and finds the
// first complete one.
class StopFilter {
 public:
  explicit StopFilter(const std::vector<std::string>& stops) : stops_(stops) {}

  // Adds text; returns what is safe to emit. *stopped when a stop string
  // completed (the returned text ends right before it).
  std::string push(const std::string& text, bool* stopped) {
    held_ += text;
    size_t first = std::string::npos;
    for (const std::string& s : stops_)
      if (!s.empty()) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      *stopped = true;
      std::string out = held_.substr(0, first);
      held_.clear();
      return out;
    }
    size_t keep = 0;  // longest suffix of held_ that is a proper prefix of a stop string
    for (const std::string& s : stops_)
      for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len)
        if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  std::string flush() {
    std::string out;
    out.swap(held_);
    return out;
  }

 private:
  const std::vector<std::string>& stops_;
  std::string held_;
};

}  // namespace

double GenerationResult::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? static_cast<double>(prefill_tokens) / prefill_seconds : 0;
}
double GenerationResult::decode_tokens_per_second() const {
  return decode_seconds > 0 ? static_cast<double>(decode_steps) / decode_seconds : 0;
}

std::vector<int32_t> end_of_sequence_ids(const model::ModelConfig& config,
                                         const tokenizer::Tokenizer* tokenizer) {
  std::vector<int32_t> ids = config.eos_token_ids;
  if (tokenizer)
    for (int32_t id : tokenizer->eos_ids())
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

void check_prompt_fits(int64_t prompt_tokens, int64_t max_positions, const std::string& field) {
  if (prompt_tokens == 0) throw InputError("", field, "is empty (no tokens to start from)");
  if (prompt_tokens >= max_positions)
    throw InputError("", field,
                     "has " + std::to_string(prompt_tokens) + " tokens; the context holds " +
                         std::to_string(max_positions) + " positions, leaving no room to generate");
}

Generator::Generator(model::Transformer& model, model::AttentionBackend& backend,
                     const tokenizer::Tokenizer* tokenizer)
    : model_(model), backend_(backend), tokenizer_(tokenizer) {}

namespace {

// One run of Generator::run: its state, and the phases that move it on
// (prefill with its side passes and inserted tokens, decode, finish).
class GenerationRun {
 public:
  GenerationRun(model::Transformer& model, model::AttentionBackend& backend,
                const tokenizer::Tokenizer* tokenizer, const std::vector<int32_t>& prompt,
                const GenerationOptions& o, const TextCallback& on_text,
                const StepCallback& on_step)
      : model_(model),
        backend_(backend),
        o_(o),
        on_text_(on_text),
        on_step_(on_step),
        sampler_(o.sampling),
        stops_(o.stop_strings) {
    if (o.stop_at_eos) eos_ = end_of_sequence_ids(model.config(), tokenizer);
    r_.prompt_ids = prompt;
    r_.prefill_tokens = int64_t(prompt.size());
    if (tokenizer) {
      decoder_ = std::make_unique<tokenizer::StreamDecoder>(*tokenizer);
      // The prompt is context, not output: a SentencePiece decoder strips the
      // first space of a decode, so the first generated token would lose its
      // leading space if decoded alone.
      decoder_->prime(prompt);
    }
  }

  // Prefill in chunks; only the last token's logits are needed. A chunk never
  // crosses the side passes' position nor the inserted tokens' bounds.
  void prefill() {
    const auto start = Clock::now();
    const std::vector<int32_t>& prompt = r_.prompt_ids;
    const torch::Tensor ids =
        torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), torch::kInt64);
    model_.announce_sequence_length(r_.prefill_tokens);
    const int64_t side_at = o_.side_passes_at > 0 && o_.side_passes_at < r_.prefill_tokens
                                ? o_.side_passes_at
                                : r_.prefill_tokens;
    model::Transformer* const ins_model = o_.inserted_model;
    const int64_t ins_end = ins_model ? o_.inserted_at + o_.inserted : -1;
    if (ins_model) {
      KVSCOPE_CHECK(o_.inserted > 0 && o_.inserted_at >= 0 && ins_end <= r_.prefill_tokens,
                    "Generator: inserted tokens outside the prompt");
      ins_model->announce_sequence_length(r_.prefill_tokens);
    }
    for (int64_t p = 0; p < r_.prefill_tokens;) {
      int64_t stop = r_.prefill_tokens;
      for (int64_t b : {side_at, ins_model ? o_.inserted_at : int64_t(-1), ins_end})
        if (b > p) stop = std::min(stop, b);
      const bool inserted = ins_model && p == o_.inserted_at;
      const int64_t n = inserted ? o_.inserted : std::min(o_.prefill_chunk, stop - p);
      torch::Tensor step_logits =
          (inserted ? *ins_model : model_).forward(ids.narrow(0, p, n), p, backend_);
      if (!inserted) logits_ = step_logits;
      // Observers see every forward pass: a capture records each chunk as a step.
      const bool last = p + n >= r_.prefill_tokens;
      if (last) token_ = choose(logits_, r_.prefill_tokens);
      if (on_step_) {
        StepEvent ev{p, n, true, &step_logits, last ? token_ : -1, last && token_forced_};
        ev.inserted = inserted;
        on_step_(ev);
      }
      p += n;
      if (p == side_at) side_passes(side_at);
    }
    r_.prefill_seconds = seconds_since(start);
    run_probe();  // not the prefill's time
  }

  // One forward step per decode position until a stop (accept() says which).
  void decode(int64_t max_positions) {
    torch::Tensor next = torch::empty({1}, torch::kInt64);
    for (int64_t pos = r_.prefill_tokens; !accept(); ++pos) {
      if (pos >= max_positions) {
        r_.finish_reason = "context";
        break;
      }
      const auto step_start = Clock::now();
      next.data_ptr<int64_t>()[0] = token_;
      logits_ = model_.forward(next, pos, backend_);
      token_ = choose(logits_, pos + 1);
      r_.decode_seconds += seconds_since(step_start);
      ++r_.decode_steps;
      if (on_step_) on_step_({pos, 1, false, &logits_, token_, token_forced_});
      run_probe();
    }
  }

  // The text the stop filter still holds, unless a stop string ended the run.
  GenerationResult finish() {
    if (decoder_ && r_.finish_reason != "stop") {
      bool stopped = false;
      emit(stops_.push(decoder_->finish(), &stopped));
      emit(stops_.flush());
    }
    return std::move(r_);
  }

 private:
  // The token each step feeds next (at `next_pos`): the forced ones first,
  // then samples; the answer probe runs before the first sample.
  int32_t choose(const torch::Tensor& step_logits, int64_t next_pos) {
    token_forced_ = forced_chosen_ < o_.forced_tokens.size();
    if (token_forced_) return o_.forced_tokens[forced_chosen_++];
    if (!probed_ && !o_.answer_probe.empty()) probe_answer(step_logits, next_pos);
    probed_ = true;
    return sampler_.next(step_logits[0]);
  }

  // The answer probe, first part: the answer's first token read off the
  // answer step's logits; the others are read off one probe step feeding the
  // answer's tokens at `pos` (run_probe), once the step's own work is done
  // (a prefill's side passes included).
  void probe_answer(const torch::Tensor& step_logits, int64_t pos) {
    const std::vector<int32_t>& answer = o_.answer_probe;
    if (pos + int64_t(answer.size()) - 1 > model_.config().context_length) return;  // no room
    const torch::Tensor first = torch::log_softmax(step_logits[0].to(torch::kFloat64), -1);
    const double lp0 = first[answer[0]].item<double>();
    r_.answer_rank = 1 + (first > lp0).sum().item<int64_t>();
    r_.answer_token_logprobs = {lp0};
    r_.answer_logprob = lp0;
    probe_pos_ = answer.size() > 1 ? pos : -1;
  }

  void run_probe() {
    if (probe_pos_ < 0) return;
    const std::vector<int32_t>& answer = o_.answer_probe;
    const bool probe_on = backend_.set_probe_pass(true);
    KVSCOPE_CHECK(probe_on, "Generator: the attention backend cannot run an answer probe");
    const torch::Tensor ids =
        torch::tensor(std::vector<int64_t>(answer.begin(), answer.end() - 1), torch::kInt64);
    const torch::Tensor lp = torch::log_softmax(
        model_.forward(ids, probe_pos_, backend_, /*all_logits=*/true).to(torch::kFloat64), -1);
    backend_.set_probe_pass(false);
    for (size_t i = 1; i < answer.size(); ++i) {
      r_.answer_token_logprobs.push_back(lp[int64_t(i) - 1][answer[i]].item<double>());
      r_.answer_logprob += r_.answer_token_logprobs.back();
    }
    probe_pos_ = -1;
  }

  // Takes the chosen token into the result; true when it ends the run (EOS,
  // a stop string, max_new_tokens). A forced token is context, like the
  // prompt: no output, no end of the run.
  bool accept() {
    if (token_forced_) {
      ++r_.forced_tokens;
      if (decoder_) decoder_->prime({token_});
      return false;
    }
    r_.output_ids.push_back(token_);
    if (std::find(eos_.begin(), eos_.end(), token_) != eos_.end()) {
      r_.finish_reason = "eos";
      return true;
    }
    if (decoder_) {
      bool stopped = false;
      emit(stops_.push(decoder_->push(token_), &stopped));
      if (stopped) {
        r_.finish_reason = "stop";
        return true;
      }
    }
    if (int64_t(r_.output_ids.size()) >= o_.max_new_tokens) {
      r_.finish_reason = "length";
      return true;
    }
    return false;
  }

  void emit(const std::string& text) {
    if (text.empty()) return;
    r_.text += text;
    if (on_text_) on_text_(text);
  }

  // Side passes at `at`: each chunk one forward step at the positions from there.
  void side_passes(int64_t at) {
    for (const std::vector<int32_t>& side : o_.side_passes) {
      if (side.empty()) continue;
      const int64_t context = model_.config().context_length;
      if (at + int64_t(side.size()) > context)
        throw InputError("", "side pass",
                         "needs positions up to " + std::to_string(at + int64_t(side.size())) +
                             "; the model's context holds " + std::to_string(context));
      const bool side_pass_on = backend_.set_side_pass(true);
      KVSCOPE_CHECK(side_pass_on, "Generator: the attention backend cannot run side passes");
      const torch::Tensor side_ids =
          torch::tensor(std::vector<int64_t>(side.begin(), side.end()), torch::kInt64);
      torch::Tensor side_logits = model_.forward(side_ids, at, backend_);
      backend_.set_side_pass(false);
      if (on_step_) {
        StepEvent ev{at, int64_t(side.size()), false, &side_logits, -1, false};
        ev.side_ids = &side;
        on_step_(ev);
      }
    }
  }

  model::Transformer& model_;
  model::AttentionBackend& backend_;
  const GenerationOptions& o_;
  const TextCallback& on_text_;
  const StepCallback& on_step_;
  Sampler sampler_;
  StopFilter stops_;
  std::vector<int32_t> eos_;
  std::unique_ptr<tokenizer::StreamDecoder> decoder_;
  GenerationResult r_;
  torch::Tensor logits_;
  int32_t token_ = -1;
  size_t forced_chosen_ = 0;
  bool token_forced_ = false;
  bool probed_ = false;
  int64_t probe_pos_ = -1;  // the probe step's position while it is pending
};

}  // namespace

GenerationResult Generator::run(const std::vector<int32_t>& prompt, const GenerationOptions& o,
                                const TextCallback& on_text, const StepCallback& on_step) {
  const int64_t max_positions =
      o.max_positions > 0 ? o.max_positions : model_.config().context_length;
  check_prompt_fits(static_cast<int64_t>(prompt.size()), max_positions);
  if (!o.forced_tokens.empty())
    check_prompt_fits(static_cast<int64_t>(prompt.size() + o.forced_tokens.size()), max_positions,
                      "prompt + forced tokens");
  if (!o.stop_strings.empty() && !tokenizer_)
    throw InputError("", "--stop", "stop strings need a tokenizer");
  if (o.max_new_tokens <= 0) throw InputError("", "--max-new", "must be positive");
  if (o.prefill_chunk <= 0) throw InputError("", "--prefill-chunk", "must be positive");
  GenerationRun run(model_, backend_, tokenizer_, prompt, o, on_text, on_step);
  run.prefill();
  run.decode(max_positions);
  return run.finish();
}

}  // namespace kvscope::generate
