// restorekv on stories260K through the whole capture: the restore tokens are
// sequence tokens of the trace ("<restore i>", ids after the vocabulary), fed
// through the adapted model right after KVzip's pass; the eviction keeps n
// fewer context entries than KVzip's budget and never a restore entry; the
// decode reads exactly what the trainer's dense student reads (greedy tokens
// and the oracle's KL recomputed from the trace's kept sets with
// gates::restored_logits); bad gate files and budgets are refused by name. The
// trainer: tests/train/test_training.cpp ("restorekv training").
#include "capture/gates/gate_set.h"
#include "capture/gates/restorekv_model.h"
#include "capture/generate/engine.h"
#include "capture/recorder/capture_run.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

constexpr int64_t kRestore = 4, kBudget = 16;

generate::Engine stories_engine() {
  generate::ModelOptions o;
  o.model = test::stories_model_path();
  o.tokenizer = test::stories_tokenizer_path();
  return generate::open_engine(o);
}

// Restore tokens and adapters far from the identity (seeded), so that a
// restore pass run without them, or a LoRA left out, changes the logits.
std::string random_restore_gates(const model::ModelConfig& c, const std::string& name) {
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet g =
      gates::init_gates(gates::GateKind::RestoreKv,
                        gates::resolve_hyperparameters(gates::GateKind::RestoreKv, shape,
                                                       {{"tokens", kRestore}}, "test"),
                        shape, 0);
  torch::manual_seed(5);
  for (auto& [key, t] : g.params)
    t = torch::randn(t.sizes()) * (key == "restore_embeddings" ? 1.0 : 0.2);
  const std::string path = test::temp_dir() + "/" + name + ".safetensors";
  gates::save_gates(g, path);
  return path;
}

}  // namespace

TEST_CASE(
    "restorekv: restore tokens in the trace, the budget matched, the decode as the "
    "trainer's student reads it",
    "[capture][restorekv]") {
  generate::Engine engine = stories_engine();
  model::Transformer& base = *engine.model;
  const model::ModelConfig& c = base.config();
  const std::string gates_path = random_restore_gates(c, "restorekv-random");
  recorder::CaptureRequest req;
  req.prompt_text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her red ball. One day, she saw a big dog.";
  req.prompt_ids = engine.tokenizer->encode(req.prompt_text, true);
  const int64_t T = int64_t(req.prompt_ids.size());
  REQUIRE(T > 30);
  req.generation.max_new_tokens = 10;
  req.generation.stop_at_eos = false;
  req.generation.prefill_chunk = 16;
  req.policy = "restorekv:gates=" + gates_path + ",budget=" + std::to_string(kBudget);
  req.levels = "received";
  req.oracle = true;
  req.output = test::temp_dir() + "/restorekv.kvtrace.h5";
  const recorder::CaptureResult result = recorder::run_capture(engine, req);
  REQUIRE(trace::validate_trace(req.output).ok());
  auto r = trace::TraceReader::open(req.output);
  const std::vector<int32_t>& out = result.generation.output_ids;
  REQUIRE(out.size() == 10);

  // The restore tokens follow the context, then the generated tokens.
  const std::vector<trace::TokenRecord> tokens = r->tokens(0, r->n_tokens());
  REQUIRE(int64_t(tokens.size()) == T + kRestore + 9);
  for (int64_t i = 0; i < kRestore; ++i) {
    CHECK(tokens[size_t(T + i)].id == c.vocab_size + i);
    CHECK(tokens[size_t(T + i)].text == "<restore " + std::to_string(i) + ">");
  }
  CHECK(tokens[size_t(T + kRestore)].id == out[0]);
  CHECK(r->run().model.vocab_size == c.vocab_size + kRestore);

  // Kept after the restore step: n fewer context entries per head on
  // average, every restore entry, the sinks.
  const int64_t L = c.n_layers, K = c.n_kv_heads;
  std::vector<torch::Tensor> keep;
  int64_t kept_context = 0;
  for (int l = 0; l < L; ++l) {
    torch::Tensor k = torch::zeros({K, T}, torch::kBool);
    for (int h = 0; h < K; ++h) {
      trace::HeadLifetimes life = r->lifetimes(l, h);
      for (int64_t p = 0; p < T; ++p)
        if (life.evict_step[size_t(p)] < 0) k[h][p] = true;
      for (int64_t p = T; p < T + kRestore; ++p) CHECK(life.evict_step[size_t(p)] < 0);
      for (int64_t p = 0; p < 4; ++p) CHECK(life.evict_step[size_t(p)] < 0);
    }
    kept_context += k.sum().item<int64_t>();
    keep.push_back(k);
  }
  CHECK(kept_context == L * K * (kBudget - kRestore));

  // The dense reference: the restore pass over every context entry through
  // the adapted model, the decode over the kept entries and the restore
  // entries; the full cache without restore tokens at the same positions.
  torch::NoGradGuard no_grad;
  const gates::GateSet g = gates::load_gates(gates_path, c);
  model::Transformer adapted(gates::restorekv_config(c, g),
                             gates::restorekv_weights(base.weights(), g));
  std::vector<int64_t> ctx(req.prompt_ids.begin(), req.prompt_ids.end()),
      fed(out.begin(), out.end() - 1);
  const gates::ContextEntries context = gates::context_entries(base, torch::tensor(ctx));
  const torch::Tensor restore_ids = torch::arange(c.vocab_size, c.vocab_size + kRestore);
  const torch::Tensor student = gates::restored_logits(base, &adapted, context, keep, restore_ids,
                                                       torch::tensor(fed), T + kRestore);
  std::vector<torch::Tensor> all;
  for (const torch::Tensor& k : keep) all.push_back(torch::ones_like(k));
  const torch::Tensor full = gates::restored_logits(base, nullptr, context, all, restore_ids,
                                                    torch::tensor(fed), T + kRestore);
  // The first token comes from the context's last logits, not the restore tokens'.
  CHECK(context.logits[T - 1].argmax().item<int64_t>() == out[0]);
  const std::vector<trace::StepRecord> steps = r->steps(0, r->n_steps());
  const std::vector<float> kl = r->oracle_kl(0, r->n_steps());
  int64_t compared = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].kind != trace::StepKind::Decode) continue;
    const int64_t j = steps[s].first_token - (T + kRestore);
    REQUIRE(j >= 0);
    REQUIRE(j < int64_t(fed.size()));
    CHECK(student[j].argmax().item<int64_t>() == out[size_t(j + 1)]);
    const torch::Tensor lf = torch::log_softmax(full[j], -1),
                        ls = torch::log_softmax(student[j], -1);
    const double expected = (lf.exp() * (lf - ls)).sum().item<double>();
    CHECK(kl[s] == Approx(expected).epsilon(1e-3).margin(1e-5));
    ++compared;
  }
  CHECK(compared == 9);
  // Mutation guard: the adapters matter (without the restore pass the
  // student differs), so the agreement above is not vacuous.
  const torch::Tensor kvzip_only = gates::restored_logits(base, nullptr, context, keep, restore_ids,
                                                          torch::tensor(fed), T + kRestore);
  CHECK((kvzip_only - student).abs().max().item<double>() > 1e-2);
}

TEST_CASE(
    "restorekv: a budget without room for the context and a gate file of another kind "
    "are refused by name",
    "[capture][restorekv]") {
  generate::Engine engine = stories_engine();
  const std::string gates_path = random_restore_gates(engine.model->config(), "restorekv-small");
  recorder::CaptureRequest req;
  req.prompt_text = "Once upon a time, there was a little girl named Lily who loved her dog.";
  req.prompt_ids = engine.tokenizer->encode(req.prompt_text, true);
  req.generation.max_new_tokens = 2;
  req.output = test::temp_dir() + "/restorekv-bad.kvtrace.h5";
  req.policy = "restorekv:gates=" + gates_path + ",budget=8";
  try {
    recorder::run_capture(engine, req);
    FAIL("a budget of 8 with 4 restore tokens and 4 sinks ran");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("restorekv:budget") != std::string::npos);
    CHECK(std::string(e.what()).find("expected > 8") != std::string::npos);
  }
  const gates::GateShape shape = gates::GateShape::of(engine.model->config());
  gates::GateSet dms = gates::init_gates(
      gates::GateKind::Dms, gates::default_hyperparameters(gates::GateKind::Dms, shape), shape, 0);
  const std::string dms_path = test::temp_dir() + "/restorekv-dms.safetensors";
  gates::save_gates(dms, dms_path);
  req.policy = "restorekv:gates=" + dms_path + ",budget=16";
  try {
    recorder::run_capture(engine, req);
    FAIL("a DMS gate file ran as restore tokens");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("kind restorekv") != std::string::npos);
  }
}
