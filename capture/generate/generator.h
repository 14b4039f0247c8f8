// The generation loop: chunked prefill of the prompt, then one token per
// forward pass through the attention backend, with a sampler, EOS ids and
// stop strings, streaming text as it becomes complete. Timing is measured
// here so every front end reports the same prefill and decode rates.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "capture/generate/sampler.h"
#include "capture/model/attention_backend.h"
#include "capture/model/transformer.h"
#include "capture/tokenizer/tokenizer.h"

namespace kvscope::generate {

struct GenerationOptions {
  int64_t max_new_tokens = 256;
  SamplingOptions sampling;
  std::vector<std::string> stop_strings;  // generation ends before the first match
  int64_t prefill_chunk = 512;            // prompt tokens per forward pass
  int64_t max_positions = 0;              // 0: the model's context length
  bool stop_at_eos = true;
  // Teacher forcing: tokens fed as decode steps right after the prompt, one
  // per step, as if generated, before sampling resumes (a task's forced
  // distractors and question). They are context, not output: no EOS or stop
  // string ends them and max_new_tokens counts only the sampled tokens.
  std::vector<int32_t> forced_tokens;
  // Side passes (a policy's context reconstruction, policy::ReconstructionChunk):
  // after the prefill, each chunk is fed as one forward step at the positions
  // right after the prompt, through a backend in side-pass mode (it keeps none
  // of their entries); their logits are not used. Counted in prefill_seconds.
  std::vector<std::vector<int32_t>> side_passes;
  // The prompt position the side passes run at (the prefill stops there and
  // resumes after them); -1: after the whole prompt.
  int64_t side_passes_at = -1;
  // Inserted tokens (a policy's, policy::CapturePlan::inserted: RestoreKV's
  // restore tokens): prompt positions [inserted_at, inserted_at + inserted)
  // hold them and are fed as one step through `inserted_model` instead of the
  // run's model, right after the side passes. Their logits predict nothing:
  // when they end the prompt, the first token comes from the step before.
  model::Transformer* inserted_model = nullptr;
  int64_t inserted_at = -1, inserted = 0;
  // The answer probe: at the answer step (the first token to sample), these
  // tokens (an expected answer) are fed as one step through a backend in
  // probe mode (it keeps nothing of them), teacher-forced; their
  // log-probabilities are the result's answer_logprob. Empty: no probe.
  std::vector<int32_t> answer_probe;
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;  // sampled ids, an EOS id included when it ended the run
  std::string text;                 // decoded output (no EOS, cut before a stop string)
  int64_t forced_tokens = 0;        // teacher-forced decode steps fed (GenerationOptions)
  std::string finish_reason;        // "eos", "stop", "length" or "context"
  int64_t prefill_tokens = 0;
  int64_t decode_steps = 0;  // forward passes after the prefill (forced ones included)
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // The answer probe (GenerationOptions::answer_probe): the sum of its
  // tokens' log-probabilities, each given the ones before (NaN: no probe),
  // per token, and the first one's rank among the answer step's logits (1:
  // the argmax; -1: no probe).
  double answer_logprob = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> answer_token_logprobs;
  int64_t answer_rank = -1;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

// What a forward pass produced, for observers (the capture recorder, tests):
// one event per prefill chunk (token -1 except for the last chunk), then one
// per decode step.
struct StepEvent {
  int64_t pos0 = 0;
  int64_t n = 0;
  bool prefill = false;
  const torch::Tensor* logits = nullptr;  // [1, V] float32 of the step's last token
  int32_t token = -1;   // the token the next step feeds, chosen after these logits (-1: none)
  bool forced = false;  // that token is teacher-forced, not sampled from the logits
  // A side-pass step (GenerationOptions::side_passes): `ids` are its tokens,
  // none of the sequence's; prefill is false and token -1.
  const std::vector<int32_t>* side_ids = nullptr;
  bool inserted = false;  // the step of the inserted tokens (GenerationOptions::inserted)
};

using TextCallback = std::function<void(const std::string&)>;
using StepCallback = std::function<void(const StepEvent&)>;

// Throws InputError (naming `field`) unless a prompt of this many tokens
// leaves room to generate in a context of max_positions (run() checks it, and
// the prompt with the forced tokens as "prompt + forced tokens"; callers that prepare
// work before run(), such as a capture creating its trace, check it first).
void check_prompt_fits(int64_t prompt_tokens, int64_t max_positions,
                       const std::string& field = "prompt");

class Generator {
 public:
  // tokenizer may be null: ids only, no text and no stop strings.
  Generator(model::Transformer& model, model::AttentionBackend& backend,
            const tokenizer::Tokenizer* tokenizer);

  // Throws InputError for an empty prompt, a prompt (with the forced tokens)
  // that leaves no room in the context, or stop strings without a tokenizer.
  GenerationResult run(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                       const TextCallback& on_text = {}, const StepCallback& on_step = {});

 private:
  model::Transformer& model_;
  model::AttentionBackend& backend_;
  const tokenizer::Tokenizer* tokenizer_;
};

// The ids that end a sequence: the model config's and the tokenizer's.
std::vector<int32_t> end_of_sequence_ids(const model::ModelConfig& config,
                                         const tokenizer::Tokenizer* tokenizer);

}  // namespace kvscope::generate
