#include "capture/generate/generator.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

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

GenerationResult Generator::run(const std::vector<int32_t>& prompt, const GenerationOptions& o,
                                const TextCallback& on_text, const StepCallback& on_step) {
  const int64_t max_positions =
      o.max_positions > 0 ? o.max_positions : model_.config().context_length;
  check_prompt_fits(static_cast<int64_t>(prompt.size()), max_positions);
  const std::vector<int32_t>& forced = o.forced_tokens;
  if (!forced.empty())
    check_prompt_fits(static_cast<int64_t>(prompt.size() + forced.size()), max_positions,
                      "prompt + forced tokens");
  if (!o.stop_strings.empty() && !tokenizer_)
    throw InputError("", "--stop", "stop strings need a tokenizer");
  if (o.max_new_tokens <= 0) throw InputError("", "--max-new", "must be positive");
  if (o.prefill_chunk <= 0) throw InputError("", "--prefill-chunk", "must be positive");

  Sampler sampler(o.sampling);
  const std::vector<int32_t> eos =
      o.stop_at_eos ? end_of_sequence_ids(model_.config(), tokenizer_) : std::vector<int32_t>{};
  GenerationResult r;
  r.prompt_ids = prompt;
  r.prefill_tokens = static_cast<int64_t>(prompt.size());
  std::unique_ptr<tokenizer::StreamDecoder> decoder;
  if (tokenizer_) {
    decoder = std::make_unique<tokenizer::StreamDecoder>(*tokenizer_);
    // The prompt is context, not output: a SentencePiece decoder strips the
    // first space of a decode, so the first generated token would lose its
    // leading space if decoded alone.
    decoder->prime(prompt);
  }
  StopFilter stops(o.stop_strings);
  auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    r.text += text;
    if (on_text) on_text(text);
  };

  // The token each step feeds next: the forced ones first, then samples.
  size_t forced_chosen = 0;
  bool token_forced = false;
  auto choose = [&](const torch::Tensor& step_logits) {
    token_forced = forced_chosen < forced.size();
    return token_forced ? forced[forced_chosen++] : sampler.next(step_logits[0]);
  };

  // Prefill in chunks; only the last token's logits are needed.
  const auto start = Clock::now();
  torch::Tensor ids =
      torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), torch::kInt64);
  model_.announce_sequence_length(r.prefill_tokens);
  torch::Tensor logits;
  int32_t token = -1;
  // Side passes at `at`: each chunk one forward step at the positions from there.
  auto run_side_passes = [&](int64_t at) {
    for (const std::vector<int32_t>& side : o.side_passes) {
      if (side.empty()) continue;
      const int64_t context = model_.config().context_length;
      if (at + int64_t(side.size()) > context)
        throw InputError("", "side pass",
                         "needs positions up to " + std::to_string(at + int64_t(side.size())) +
                             "; the model's context holds " + std::to_string(context));
      if (!backend_.set_side_pass(true))
        throw std::logic_error("Generator: the attention backend cannot run side passes");
      const torch::Tensor side_ids =
          torch::tensor(std::vector<int64_t>(side.begin(), side.end()), torch::kInt64);
      torch::Tensor side_logits = model_.forward(side_ids, at, backend_);
      backend_.set_side_pass(false);
      if (on_step) {
        StepEvent ev{at, int64_t(side.size()), false, &side_logits, -1, false};
        ev.side_ids = &side;
        on_step(ev);
      }
    }
  };
  const int64_t side_at = o.side_passes_at > 0 && o.side_passes_at < r.prefill_tokens
                              ? o.side_passes_at
                              : r.prefill_tokens;
  const int64_t ins_end = o.inserted_model ? o.inserted_at + o.inserted : -1;
  if (o.inserted_model) {
    if (o.inserted <= 0 || o.inserted_at < 0 || ins_end > r.prefill_tokens)
      throw std::logic_error("Generator: inserted tokens outside the prompt");
    o.inserted_model->announce_sequence_length(r.prefill_tokens);
  }
  for (int64_t p = 0; p < r.prefill_tokens;) {
    // A chunk never crosses the side passes' position nor the inserted tokens' bounds.
    int64_t stop = r.prefill_tokens;
    for (int64_t b : {side_at, o.inserted_model ? o.inserted_at : int64_t(-1), ins_end})
      if (b > p) stop = std::min(stop, b);
    const bool inserted = o.inserted_model && p == o.inserted_at;
    const int64_t n = inserted ? o.inserted : std::min(o.prefill_chunk, stop - p);
    torch::Tensor step_logits =
        (inserted ? *o.inserted_model : model_).forward(ids.narrow(0, p, n), p, backend_);
    if (!inserted) logits = step_logits;
    // Observers see every forward pass: a capture records each chunk as a step.
    const bool last = p + n >= r.prefill_tokens;
    if (last) token = choose(logits);
    if (on_step) {
      StepEvent ev{p, n, true, &step_logits, last ? token : -1, last && token_forced};
      ev.inserted = inserted;
      on_step(ev);
    }
    p += n;
    if (p == side_at) run_side_passes(side_at);
  }
  r.prefill_seconds = seconds_since(start);

  int64_t pos = r.prefill_tokens;
  torch::Tensor next = torch::empty({1}, torch::kInt64);
  while (true) {
    if (token_forced) {
      // Context, like the prompt: no output, no end of the run.
      ++r.forced_tokens;
      if (decoder) decoder->prime({token});
    } else {
      r.output_ids.push_back(token);
      if (std::find(eos.begin(), eos.end(), token) != eos.end()) {
        r.finish_reason = "eos";
        break;
      }
      if (decoder) {
        bool stopped = false;
        emit(stops.push(decoder->push(token), &stopped));
        if (stopped) {
          r.finish_reason = "stop";
          break;
        }
      }
      if (static_cast<int64_t>(r.output_ids.size()) >= o.max_new_tokens) {
        r.finish_reason = "length";
        break;
      }
    }
    if (pos >= max_positions) {
      r.finish_reason = "context";
      break;
    }
    const auto step_start = Clock::now();
    next.data_ptr<int64_t>()[0] = token;
    logits = model_.forward(next, pos, backend_);
    token = choose(logits);
    r.decode_seconds += seconds_since(step_start);
    ++r.decode_steps;
    if (on_step) on_step({pos, 1, false, &logits, token, token_forced});
    ++pos;
  }
  if (decoder && r.finish_reason != "stop") {
    bool stopped = false;
    emit(stops.push(decoder->finish(), &stopped));
    emit(stops.flush());
  }
  return r;
}

}  // namespace kvscope::generate
