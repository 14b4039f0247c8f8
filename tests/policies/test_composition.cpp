// Composition: parts of different kinds run together (the seeds' WG-KV
// admission with Quest selection), wrappers reshape any scorer and equal the
// named policies they generalise, budgets as fractions of the prompt, and
// contradictory or malformed specs are refused naming what is wrong. A part
// that decides something impossible stops the run naming policy, layer, head
// and position. docs/policies/composition.md
#include <map>
#include <set>
#include <tuple>

#include "capture/policy/composed.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

constexpr int64_t kDecode = 10;

std::vector<EventKey> all_events(const std::string& spec,
                                 std::vector<trace::Event>* raw = nullptr) {
  return events_of_story_run(spec, kDecode, raw);
}

std::string error_of(const std::string& spec, int64_t prompt_tokens = 0) {
  try {
    policy::PolicyInstance p = policy::make_policy(spec, {prompt_tokens, ""});
    std::unique_ptr<model::Transformer> model = load_stories();
    p.policy->setup({&model->config(), 64, 32, 16});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

int64_t count(const std::vector<trace::Event>& events, trace::EventKind kind) {
  int64_t n = 0;
  for (const trace::Event& e : events) n += e.kind == kind;
  return n;
}

}  // namespace

TEST_CASE("WG-KV admission with Quest selection: the trace holds both", "[composition]") {
  const std::string gates = source_dir() + "/resources/gates/stories260K-wgkv.safetensors";
  std::vector<trace::Event> events;
  all_events("wgkv:gates=" + gates + ",window=4+quest:budget=8,page_size=4,dense_layers=1",
             &events);
  CHECK(count(events, trace::EventKind::Admit) > 0);
  CHECK(count(events, trace::EventKind::Reject) > 0);   // WG-KV's write gate said no
  CHECK(count(events, trace::EventKind::Promote) > 0);  // lazy promotion, local -> global
  CHECK(count(events, trace::EventKind::Select) > 0);   // Quest's pages at decode
  // The WG-KV decisions are those of WG-KV alone; Quest only adds selections.
  std::vector<trace::Event> alone;
  all_events("wgkv:gates=" + gates + ",window=4", &alone);
  std::vector<trace::Event> composed_no_select;
  for (const trace::Event& e : events)
    if (e.kind != trace::EventKind::Select) composed_no_select.push_back(e);
  REQUIRE(composed_no_select.size() == alone.size());
  // Reasons: each part's numbers mapped onto the composite's table.
  policy::PolicyInstance pi =
      policy::make_policy("wgkv:gates=" + gates + "+quest:budget=8,page_size=4");
  const std::vector<std::string> reasons = pi.policy->reason_names();
  for (const trace::Event& e : events) {
    REQUIRE(e.reason < reasons.size());
    if (e.kind == trace::EventKind::Select)
      CHECK_THAT(reasons[e.reason], Catch::StartsWith("quest: "));
    if (e.kind == trace::EventKind::Promote)
      CHECK_THAT(reasons[e.reason], Catch::StartsWith("wgkv: "));
  }
  CHECK(pi.name == "wgkv+quest");
}

TEST_CASE("wrappers around a scorer keep exactly the named policies' sets", "[composition]") {
  CHECK((all_events("snapkv:budget=12,window=4,kernel=3+pyramid:beta=4") ==
         all_events("pyramidkv:budget=12,window=4,kernel=3,beta=4")));
  CHECK((all_events("knorm:budget=12+adakv:alpha=0.5") ==
         all_events("adakv:scorer=knorm,budget=12,alpha=0.5")));
  // And a wrapper changes something: AdaKV's shared budget is not uniform.
  CHECK((all_events("knorm:budget=12+adakv:alpha=0.5") != all_events("knorm:budget=12")));
}

TEST_CASE("chunk: entries leave by whole chunks of consecutive positions", "[composition]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  std::vector<int64_t> ids = story_prompt_ids();
  const int64_t n = int64_t(ids.size());
  for (const char* spec : {"knorm:budget=12+chunk:size=4", "knorm:budget=12"}) {
    PolicyRun run(*model, spec, n + 1, n);
    run.feed(*model, ids, 0);
    int64_t partial = 0;  // chunks a head holds only part of (the prompt's last may be short)
    for (int64_t l = 0; l < model->config().n_layers; ++l)
      for (int64_t h = 0; h < model->config().n_kv_heads; ++h) {
        std::map<int64_t, int64_t> per_chunk;
        for (int64_t p : run.held(l, h)) ++per_chunk[p / 4];
        for (auto [c, k] : per_chunk) partial += k < std::min<int64_t>(4, n - c * 4);
      }
    const int64_t heads = model->config().n_layers * model->config().n_kv_heads;
    INFO(spec << ": " << partial << " partial chunks over " << heads << " heads");
    if (std::string(spec).find("chunk") != std::string::npos)
      CHECK(partial <= heads);  // at most the boundary chunk of each head
    else
      CHECK(partial > heads);  // token by token, chunks are cut everywhere
  }
}

TEST_CASE(
    "budget=0.25 is a quarter of the prompt, cadence and layer ratios shape when and how much",
    "[composition]") {
  const int64_t n = int64_t(story_prompt_ids().size());
  std::unique_ptr<model::Transformer> model = load_stories();
  PolicyRun run(*model, "knorm:budget=0.25", n + 1, n);
  CHECK(run.policy().budget() == std::max<int64_t>(1, std::llround(0.25 * double(n))));
  run.feed(*model, story_prompt_ids(), 0);
  for (int64_t h = 0; h < model->config().n_kv_heads; ++h)
    CHECK(run.cache().count(0, h) == run.policy().budget());

  // Every 4 decode steps: the cache grows in between and is cut back on the
  // 4th, 8th, ... decode step (kvpress DecodingPress's counter).
  std::vector<trace::Event> events;
  all_events("knorm:budget=12+cadence:every=4", &events);
  std::set<int32_t> evicting_steps;
  for (const trace::Event& e : events)
    if (e.kind == trace::EventKind::Evict && e.step > 0) evicting_steps.insert(e.step);
  CHECK(evicting_steps == std::set<int32_t>{4, 8});

  const int64_t L = model->config().n_layers;
  std::string keep;
  for (int64_t l = 0; l < L; ++l) keep += (l ? "/" : "") + std::string(l % 2 ? "0.5" : "0.25");
  PolicyRun ratios(*model, "knorm:budget=12+layer_ratios:keep=" + keep, n + 1, n);
  ratios.feed(*model, story_prompt_ids(), 0);
  for (int64_t l = 0; l < L; ++l)
    CHECK(ratios.cache().count(l, 0) == std::llround((l % 2 ? 0.5 : 0.25) * double(n)));
}

TEST_CASE("contradictory, unknown and malformed specs are refused naming what is wrong",
          "[composition]") {
  CHECK_THAT(error_of("h2o+snapkv"), Catch::Contains("two eviction parts (h2o and snapkv)"));
  CHECK_THAT(error_of("h2o+pyramid"), Catch::Contains("no scores to reshape"));
  CHECK_THAT(error_of("pyramid"), Catch::Contains("a wrapper cannot come first"));
  CHECK_THAT(error_of("h2o+quest+h3o"), Catch::Contains("'h3o:") || Catch::Contains("h3o"));
  CHECK_THAT(error_of("knorm:budget=0.3x", 100),
             Catch::Contains("knorm:budget") && Catch::Contains("fraction"));
  CHECK_THAT(error_of("knorm:budget=1.5", 100), Catch::Contains("(0, 1]"));
  CHECK_THAT(error_of("knorm:budget=0.25"), Catch::Contains("needs the prompt's length"));
  CHECK_THAT(error_of("knorm+adakv+pyramid"),
             Catch::Contains("pyramid") && Catch::Contains("adakv"));
  CHECK_THAT(error_of("knorm+layer_ratios:keep=0.5/0.5"),
             Catch::Contains("layer_ratios:keep") && Catch::Contains("layers, got 2"));
  CHECK_THAT(error_of("knorm+layer_ratios:keep=0.5/x"), Catch::Contains("'x'"));
  CHECK_THAT(error_of("knorm:budget=8+protect:sinks=4,recent=4"),
             Catch::Contains("exceed sinks + recent"));
  CHECK(error_of("h2o:heavy=8,recent=8+quest:budget=32") == "");
}

TEST_CASE("a part over a tier no part fills is refused", "[composition]") {
  struct SelectWarm : policy::Policy {
    std::vector<policy::PartKind> kinds() const override { return {policy::PartKind::Selection}; }
    std::vector<std::string> reads_tiers() const override { return {"warm"}; }
  };
  std::vector<policy::ComposedPolicy::Part> parts;
  parts.push_back({"h2o", policy::make_policy("h2o").policy});
  parts.push_back({"select_warm", std::make_unique<SelectWarm>()});
  try {
    policy::ComposedPolicy("h2o+select_warm", std::move(parts));
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("select_warm acts on tier 'warm'") &&
                                          Catch::Contains("which no part fills (tiers: hot)"));
  }
}

TEST_CASE("kvscope policies --explain prints the composed parts", "[composition][cli]") {
  std::string out;
  REQUIRE(run_command(kvscope_exe() + " policies --explain 'snapkv:budget=0.25+adakv:alpha=0.3' "
                                      "--prompt-tokens 400",
                      &out) == 0);
  CHECK_THAT(out, Catch::Contains("snapkv+adakv [eviction]") && Catch::Contains("adaptive") &&
                      Catch::Contains("budget 100 per head") &&
                      Catch::Contains("gates: snapkv_vote"));
  REQUIRE(run_command(kvscope_exe() + " policies --explain 'h2o+snapkv'", &out) == 2);
  CHECK_THAT(out, Catch::Contains("two eviction parts"));
}

TEST_CASE("an impossible decision stops the step naming policy, layer, head and position",
          "[composition]") {
  struct EvictTwice : policy::Policy {
    std::vector<policy::PartKind> kinds() const override { return {policy::PartKind::Eviction}; }
    std::vector<std::string> reason_names() const override { return {"new token", "twice"}; }
    void after_attention(policy::LayerContext& c) override {
      if (c.layer != 1 || c.n != 1) return;
      c.decide.evict(c.layer, 0, 3, 0.0f, 1);
      c.decide.evict(c.layer, 0, 3, 0.0f, 1);  // not held any more
    }
  };
  std::vector<policy::ComposedPolicy::Part> parts;
  parts.push_back({"quest", policy::make_policy("quest:budget=8,page_size=4").policy});
  parts.push_back({"evict_twice", std::make_unique<EvictTwice>()});
  policy::ComposedPolicy composed("quest+evict_twice", std::move(parts));
  torch::InferenceMode guard;
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  composed.setup({&c, 64, 8, 16});
  policy::StepDriver driver(c, {16, 64, 8}, composed, "quest+evict_twice");
  std::vector<int64_t> ids = story_prompt_ids();
  ids.resize(9);
  model->forward(torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + 8)), 0, driver);
  try {
    model->forward(torch::tensor(std::vector<int64_t>{ids[8]}), 8, driver);
    FAIL("no error");
  } catch (const policy::PolicyError& e) {
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("policy evict_twice") && Catch::Contains("'evict'") &&
                   Catch::Contains("layer 1") && Catch::Contains("kv head 0") &&
                   Catch::Contains("position 3") && Catch::Contains("does not hold"));
  }
}

TEST_CASE("a selection that evicts is refused: the masks index the entries it was shown",
          "[composition]") {
  struct EvictInSelect : policy::Policy {
    void select(policy::SelectContext& c) override { c.decide.evict(c.layer, 0, 0, 0.0f, 0); }
  } evicting;
  torch::InferenceMode guard;
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  evicting.setup({&c, 16, 4, 16});
  policy::StepDriver driver(c, {16, 16, 4}, evicting, "evict_in_select");
  CHECK_THROWS_WITH(model->forward(torch::tensor(std::vector<int64_t>{1, 2, 3, 4}), 0, driver),
                    Catch::Contains("policy evict_in_select") && Catch::Contains("'evict'") &&
                        Catch::Contains("a selection reads the entries"));
}

}  // namespace kvscope::test
