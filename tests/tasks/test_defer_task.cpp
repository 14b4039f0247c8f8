// The deferred-salience task on stories260K's tokenizer and model: the prompt
// plants the key, the forced tokens are digit-free distractors then the
// question, deterministically; teacher forcing feeds them as decode steps (the
// model sees exactly what a prefill of the same text would show it); the
// trace gives them their roles; the DRR of a real capture is 1 under the full
// cache and 0 under a window that lost the key.
#include "tests/capture/capture_test_util.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "capture/generate/dense_kv_cache.h"
#include "capture/generate/engine.h"
#include "capture/generate/generator.h"
#include "capture/recorder/capture_run.h"
#include "capture/tasks/defer.h"
#include "core/analysis/deferred_retention.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

generate::Engine stories_engine() {
  generate::ModelOptions o;
  o.model = test::stories_dir() + "/stories260K.bin";
  o.tokenizer = test::stories_dir() + "/tok512.bin";
  return generate::open_engine(o);
}

bool has_digit(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return std::isdigit((unsigned char)c); });
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, int64_t b, int64_t e) {
  return {v.begin() + b, v.begin() + e};
}

// The message of the InputError `f` throws ("" when none).
template <class F>
std::string input_error(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE(
    "the defer task plants the key early and forces digit-free distractors, then the question",
    "[tasks][defer]") {
  generate::Engine engine = stories_engine();
  const tokenizer::Tokenizer& tok = *engine.tokenizer;
  tasks::DeferOptions o = tasks::parse_defer_spec("defer:tokens=400,distract=40,seed=7");
  CHECK(o.depth == 0.1);
  tasks::DeferTask t = tasks::make_defer_task(tok, o);

  // Deterministic in the seed; another seed changes the key and the prose.
  tasks::DeferTask again = tasks::make_defer_task(tok, o);
  CHECK(again.ids == t.ids);
  CHECK(again.forced == t.forced);
  o.seed = 8;
  tasks::DeferTask other = tasks::make_defer_task(tok, o);
  CHECK(other.answer != t.answer);
  CHECK(slice(other.forced, 0, 40) != slice(t.forced, 0, 40));

  REQUIRE(t.answer.size() == 5);
  const int64_t P = int64_t(t.ids.size());
  CHECK(P > 300);
  CHECK(P <= 400);
  // The needle: early in the prompt, and its tokens carry the key.
  const auto [nb, ne] = t.needle_span;
  CHECK(nb > 0);
  CHECK(ne <= P);
  CHECK(double(nb) < 0.3 * double(P));
  CHECK_THAT(tok.decode(slice(t.ids, nb, ne)), Catch::Contains(t.answer));
  CHECK_FALSE(has_digit(tok.decode(slice(t.ids, 0, nb))));
  CHECK_FALSE(has_digit(tok.decode(slice(t.ids, ne, P))));

  // Forced: exactly `distract` distractor tokens without digits, then the
  // question, which ends the forced tokens.
  CHECK(t.distractor_tokens == 40);
  const std::string story = tok.decode(slice(t.forced, 0, 40));
  CHECK_FALSE(has_digit(story));
  CHECK(story.find("Once upon a time") != std::string::npos);
  const auto [qb, qe] = t.question_span;
  CHECK(qb == P + 40);
  CHECK(qe == P + int64_t(t.forced.size()));
  const std::string question = tok.decode(slice(t.forced, 40, int64_t(t.forced.size())));
  CHECK_THAT(question, Catch::EndsWith("The pass key is"));
  CHECK_FALSE(has_digit(question));
  // The forced ids are those the running text gets: prompt + story + question
  // decode to the prompt's text followed by the story and the question.
  std::vector<int32_t> all = t.ids;
  all.insert(all.end(), t.forced.begin(), t.forced.end());
  const std::string whole = tok.decode(all);
  CHECK(whole.find(story) != std::string::npos);
  CHECK(whole.rfind(question) == whole.size() - question.size());

  for (uint64_t seed = 0; seed < 50; ++seed)
    CHECK_FALSE(has_digit(tasks::defer_distractor_text(seed, 2000)));
  // Without distractors the question follows the prompt.
  tasks::DeferTask none =
      tasks::make_defer_task(tok, tasks::parse_defer_spec("defer:tokens=400,distract=0"));
  CHECK(none.distractor_tokens == 0);
  CHECK(none.question_span.first == int64_t(none.ids.size()));
}

TEST_CASE("defer task specs: bad keys and values name the field", "[tasks][defer]") {
  CHECK_THAT(input_error([] { tasks::parse_defer_spec("defer:colour=3"); }),
             Catch::Contains("defer:colour") && Catch::Contains("unknown key"));
  CHECK_THAT(input_error([] { tasks::parse_defer_spec("defer:distract=-1"); }),
             Catch::Contains("defer:distract") && Catch::Contains("expected an integer 0.."));
  CHECK_THAT(input_error([] { tasks::parse_defer_spec("defer:tokens=many"); }),
             Catch::Contains("defer:tokens"));
  CHECK_THAT(input_error([] { tasks::parse_defer_spec("defer:depth=1.5"); }),
             Catch::Contains("defer:depth") && Catch::Contains("expected 0..1"));
  CHECK_THAT(input_error([] { tasks::parse_defer_spec("defer:seed="); }),
             Catch::Contains("defer:seed"));
  CHECK(input_error([] {
          tasks::parse_defer_spec("defer:tokens=500,distract=0,seed=3,depth=1");
        }).empty());
  CHECK_FALSE(tasks::is_defer_spec("deferred"));
  CHECK(tasks::is_defer_spec("defer"));
  generate::Engine engine = stories_engine();
  const std::string small = input_error([&] {
    tasks::make_defer_task(*engine.tokenizer, tasks::parse_defer_spec("defer:tokens=60"));
  });
  CHECK_THAT(small, Catch::Contains("defer:tokens") && Catch::Contains("too small for the fact"));
}

TEST_CASE("teacher forcing feeds the forced tokens as decode steps", "[tasks][defer][capture]") {
  torch::InferenceMode guard;
  generate::Engine engine = stories_engine();
  const tasks::DeferTask t = tasks::make_defer_task(
      *engine.tokenizer, tasks::parse_defer_spec("defer:tokens=400,distract=24,seed=5"));
  const int64_t P = int64_t(t.ids.size()), F = int64_t(t.forced.size()), N = 6;

  SECTION("the model sees the forced tokens as a prefill of the same text would show them") {
    generate::DenseKvCache forced_cache(engine.model->config(), 1024, torch::kCPU, torch::kFloat32);
    generate::DenseKvCache plain_cache(engine.model->config(), 1024, torch::kCPU, torch::kFloat32);
    generate::GenerationOptions o;
    o.max_new_tokens = N;
    o.stop_at_eos = false;
    o.forced_tokens = t.forced;
    std::vector<generate::StepEvent> forced_events;
    std::vector<torch::Tensor> forced_logits;
    generate::Generator gf(*engine.model, forced_cache, engine.tokenizer.get());
    generate::GenerationResult rf = gf.run(t.ids, o, {}, [&](const generate::StepEvent& ev) {
      forced_events.push_back(ev);
      forced_logits.push_back(ev.logits->clone());
    });
    CHECK(rf.forced_tokens == F);
    CHECK(rf.decode_steps == F + N - 1);
    REQUIRE(rf.output_ids.size() == size_t(N));
    // Each decode step feeds the token the step before chose: forced, then sampled.
    REQUIRE(forced_events.size() == size_t(1 + F + N - 1));
    for (int64_t i = 0; i < F; ++i) {
      INFO("forced token " << i);
      CHECK(forced_events[size_t(i)].forced);
      CHECK(forced_events[size_t(i)].token == t.forced[size_t(i)]);
      CHECK(forced_events[size_t(i + 1)].pos0 == P + i);
    }
    CHECK_FALSE(forced_events[size_t(F)].forced);

    std::vector<int32_t> whole = t.ids;
    whole.insert(whole.end(), t.forced.begin(), t.forced.end());
    generate::GenerationOptions po;
    po.max_new_tokens = N;
    po.stop_at_eos = false;
    po.prefill_chunk = 4096;
    std::vector<torch::Tensor> plain_logits;
    generate::Generator gp(*engine.model, plain_cache, engine.tokenizer.get());
    generate::GenerationResult rp = gp.run(whole, po, {}, [&](const generate::StepEvent& ev) {
      plain_logits.push_back(ev.logits->clone());
    });
    CHECK(rp.output_ids == rf.output_ids);
    CHECK(rp.text == rf.text);
    REQUIRE(plain_logits.size() == size_t(N));
    for (int64_t i = 0; i < N; ++i) {
      INFO("answer step " << i);
      const float diff =
          (forced_logits[size_t(F + i)] - plain_logits[size_t(i)]).abs().max().item<float>();
      CHECK(diff < 1e-4f);
    }
  }

  SECTION(
      "a capture records them as decode steps with the task's roles; the full cache's DRR is 1") {
    recorder::CaptureRequest req;
    req.prompt_ids = t.ids;
    req.prompt_text = t.prompt_text;
    req.generation.max_new_tokens = N;
    req.generation.stop_at_eos = false;
    req.generation.forced_tokens = t.forced;
    req.policy = "full";
    req.output = test::temp_dir() + "/defer-full.kvtrace.h5";
    req.task_kind = "defer";
    req.expected_answer = t.answer;
    req.needle_spans = {t.needle_span};
    req.question_spans = {t.question_span};
    recorder::CaptureResult result = recorder::run_capture(engine, req);
    CHECK(result.steps == 1 + F + N - 1);
    CHECK(result.generation.output_ids.size() == size_t(N));

    auto r = trace::TraceReader::open(req.output);
    REQUIRE(r->n_steps() == 1 + F + N - 1);
    REQUIRE(r->n_tokens() == P + F + N - 1);
    std::vector<trace::TokenRecord> tokens = r->tokens(0, r->n_tokens());
    std::vector<trace::StepRecord> steps = r->steps(0, r->n_steps());
    CHECK(steps[0].kind == trace::StepKind::Prefill);
    CHECK(steps[0].n_tokens == P);
    for (int64_t i = 0; i < F; ++i) {
      INFO("forced token " << i);
      const trace::TokenRecord& tr = tokens[size_t(P + i)];
      CHECK(tr.id == t.forced[size_t(i)]);
      CHECK(tr.step == 1 + i);
      CHECK(steps[size_t(1 + i)].kind == trace::StepKind::Decode);
      CHECK(steps[size_t(1 + i)].first_token == P + i);
      CHECK(tr.role ==
            (i < t.distractor_tokens ? trace::TokenRole::Prompt : trace::TokenRole::Question));
    }
    for (int64_t i = P + F; i < r->n_tokens(); ++i) {
      CHECK(tokens[size_t(i)].role == trace::TokenRole::Generated);
      CHECK(tokens[size_t(i)].id == result.generation.output_ids[size_t(i - P - F)]);
    }
    int64_t needles = 0;
    for (const trace::TokenRecord& tr : tokens) needles += tr.role == trace::TokenRole::Needle;
    CHECK(needles == t.needle_span.second - t.needle_span.first);
    // The generated text is the free answer only.
    CHECK(r->generated_text() == result.generation.text);
    CHECK_FALSE(r->generated_text().empty());

    std::optional<analysis::DeferredRetention> d = analysis::deferred_retention(*r);
    REQUIRE(d);
    CHECK(d->rate == 1.0);
    CHECK(d->always_share == 1.0);
    CHECK(d->needle_tokens == needles);
    CHECK(d->first_needed_step == 1 + t.distractor_tokens);
    CHECK(d->needed_steps == (F - t.distractor_tokens) + N - 1);
    CHECK(d->checks == needles * r->n_layers() * r->n_kv_heads() * d->needed_steps);
  }
}

TEST_CASE("kvscope capture --task defer: DRR 1 under the full cache, 0 when a window lost the key",
          "[tasks][defer][cli]") {
  const std::string dir = test::temp_dir();
  const std::string base = test::kvscope_exe() + " capture --model " + test::stories_dir() +
                           "/stories260K.bin --tokenizer " + test::stories_dir() +
                           "/tok512.bin --task defer:tokens=400,distract=32,seed=2 --max-new 4 -q";
  std::string out;
  for (const auto& [policy, rate] :
       {std::pair<std::string, double>{"full", 1.0}, {"window:window=16", 0.0}}) {
    INFO(policy);
    const std::string trace = dir + "/defer.kvtrace.h5";
    REQUIRE(test::run_command(base + " --policy " + policy + " -o " + trace, &out) == 0);
    REQUIRE(test::run_command(test::kvscope_exe() + " info --json " + trace, &out) == 0);
    const nlohmann::json j = nlohmann::json::parse(out);
    CHECK(j["task"]["kind"] == "defer");
    REQUIRE(j.contains("deferred_retention"));
    const nlohmann::json& d = j["deferred_retention"];
    CHECK(d["rate"].get<double>() == rate);
    CHECK(d["always_available_share"].get<double>() == rate);
    CHECK(d["layer_rate"].size() == 5);
    CHECK(d["needed_steps"].get<int64_t>() > 4);
    REQUIRE(test::run_command(test::kvscope_exe() + " info " + trace, &out) == 0);
    CHECK_THAT(out, Catch::Contains("retention DRR"));
  }
}
