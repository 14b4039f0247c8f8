// Parameters: every policy is registered with its paper and doc page, and bad
// parameters or head-pattern files give InputErrors naming what is wrong.
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

std::string error_of(const std::string& spec, const model::Transformer* model = nullptr) {
  try {
    policy::PolicyInstance p = policy::make_policy(spec);
    if (model) p.policy->setup({&model->config(), 64, 32, 16});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every training-free policy is registered with a paper and an existing doc page") {
  for (const char* name : {"full", "window", "streaming_llm", "h2o", "tova", "snapkv", "pyramidkv",
                           "knorm", "expected_attention", "adakv", "duo_attention", "quest"}) {
    const policy::PolicyDescriptor* d = policy::find_policy(name);
    INFO(name);
    REQUIRE(d != nullptr);
    CHECK(!d->paper.empty());
    CHECK(std::filesystem::exists(source_dir() + "/" + d->doc));
  }
}

TEST_CASE("bad policy parameters name the parameter and what it takes") {
  CHECK_THAT(error_of("snapkv:budget=8,window=16"),
             Catch::Contains("snapkv:budget") && Catch::Contains(">= window"));
  CHECK_THAT(error_of("snapkv:kernel=4"), Catch::Contains("kernel") && Catch::Contains("odd"));
  CHECK_THAT(error_of("snapkv:pooling=median"),
             Catch::Contains("pooling") && Catch::Contains("'avg' or 'max'"));
  CHECK_THAT(error_of("tova:budget=0"), Catch::Contains("tova:budget"));
  CHECK_THAT(error_of("pyramidkv:beta=0.5"), Catch::Contains("pyramidkv:beta"));
  CHECK_THAT(error_of("quest:budget=8,page_size=16"), Catch::Contains("quest:budget"));
  CHECK_THAT(error_of("expected_attention:budget=4,sinks=4"),
             Catch::Contains("expected_attention:budget"));
  CHECK_THAT(error_of("adakv:scorer=h3o"),
             Catch::Contains("unknown scorer 'h3o'") && Catch::Contains("snapkv"));
  CHECK_THAT(error_of("adakv:scorer=knorm,window=8"),
             Catch::Contains("adakv:window") && Catch::Contains("not a parameter of scorer knorm"));
  CHECK_THAT(error_of("adakv:scorer=snapkv,kernel=x"),
             Catch::Contains("kernel") && Catch::Contains("not an integer"));
  CHECK_THAT(error_of("adakv:scorer=snapkv,budget=32,window=32"), Catch::Contains("adakv:budget"));
  CHECK_THAT(error_of("adakv:alpha=2"), Catch::Contains("adakv:alpha"));
  CHECK_THAT(error_of("duo_attention"),
             Catch::Contains("duo_attention:pattern") && Catch::Contains("required"));
}

TEST_CASE("number parameters: NaN, inf and out-of-range values name the parameter and its range") {
  // pyramidkv:beta=nan used to be accepted: NaN compares false with the
  // policy's own "beta < 1" check.
  for (const char* v : {"nan", "NaN", "inf", "-inf", "infinity"})
    CHECK_THAT(error_of(std::string("pyramidkv:beta=") + v),
               Catch::Contains("pyramidkv:beta") && Catch::Contains("not a finite number") &&
                   Catch::Contains("[1, 1000000]"));
  CHECK_THAT(error_of("pyramidkv:beta=0.5"),
             Catch::Contains("pyramidkv:beta") && Catch::Contains("outside [1, 1000000]"));
  CHECK_THAT(error_of("adakv:alpha=nan"),
             Catch::Contains("adakv:alpha") && Catch::Contains("[0, 1]"));
  CHECK_THAT(error_of("duo_attention:sparsity=1.5"),
             Catch::Contains("duo_attention:sparsity") && Catch::Contains("[0, 1]"));
  CHECK_THAT(error_of("wgkv:tau=inf"), Catch::Contains("wgkv:tau") && Catch::Contains("[-1, 1]"));
  CHECK_THAT(error_of("attention_gate:gamma=nan"),
             Catch::Contains("attention_gate:gamma") && Catch::Contains("[-1000, 1000]"));
  CHECK_THAT(error_of("expected_attention:epsilon=-1"),
             Catch::Contains("expected_attention:epsilon") && Catch::Contains("[0, 1000000]"));
  // Integers too: a budget beyond 2^30 is no size a cache can hold.
  CHECK_THAT(error_of("h2o:heavy=9223372036854775807"),
             Catch::Contains("h2o:heavy") && Catch::Contains("[-1, 1073741824]"));
  CHECK_THAT(error_of("tova:budget=-5"),
             Catch::Contains("tova:budget") && Catch::Contains("outside"));
  CHECK(error_of("pyramidkv:beta=1.5").empty());
}

// Fuzzing finding (tests/fuzz/regressions/policy_spec): a string value that
// is not UTF-8 (paths need not be) made Params::to_json throw nlohmann's
// type_error.
TEST_CASE("parameters that are not UTF-8 are recorded with replacement characters") {
  policy::PolicyInstance p = policy::make_policy("wgkv:gates=g\xff.safetensors");
  std::string json;
  REQUIRE_NOTHROW(json = p.params.to_json());
  CHECK_THAT(json, Catch::Contains("g\xEF\xBF\xBD.safetensors"));
}

TEST_CASE("every policy's defaults lie within their declared ranges") {
  for (const policy::PolicyDescriptor& d : policy::builtin_policies()) {
    for (const policy::ParamSpec& p : d.params) {
      if (p.type != policy::ParamType::Int && p.type != policy::ParamType::Float) continue;
      INFO(d.name << ":" << p.name << " default '" << p.default_value << "'");
      CHECK(p.min <= p.max);
      if (p.default_value.empty()) continue;  // unset: the policy decides
      const double v = std::stod(p.default_value);
      CHECK(std::isfinite(v));
      CHECK(v >= p.min);
      CHECK(v <= p.max);
    }
  }
  // An unset number is recorded as null, not as NaN.
  policy::PolicyInstance p = policy::make_policy("attention_gate:gates=g.safetensors");
  const auto j = nlohmann::json::parse(p.params.to_json());
  CHECK(j["gamma"].is_null());
  CHECK(j["tau"] == -1.0);
}

TEST_CASE("duo_attention head-pattern files: errors name the file, row and column") {
  auto model = load_stories();  // 5 layers, 4 kv heads
  const std::string dir = temp_dir();
  CHECK_THAT(error_of("duo_attention:pattern=" + dir + "/missing.tsv"),
             Catch::Contains("missing.tsv") && Catch::Contains("cannot open"));
  std::ofstream(dir + "/bad.tsv") << "0.1\t0.2\tx\t0.4\n";
  CHECK_THAT(
      error_of("duo_attention:pattern=" + dir + "/bad.tsv"),
      Catch::Contains("bad.tsv") && Catch::Contains("row 1 column 3") && Catch::Contains("'x'"));
  std::ofstream(dir + "/short.tsv") << "0.1\t0.2\t0.3\t0.4\n0.1\t0.2\n";
  CHECK_THAT(error_of("duo_attention:pattern=" + dir + "/short.tsv", model.get()),
             Catch::Contains("short.tsv") && Catch::Contains("5 rows"));
  {
    std::ofstream f(dir + "/cols.tsv");
    for (int i = 0; i < 5; ++i) f << "0.1\t0.2\t0.3\n";
  }
  CHECK_THAT(error_of("duo_attention:pattern=" + dir + "/cols.tsv", model.get()),
             Catch::Contains("row 1") && Catch::Contains("4 values (one per kv head)"));
  std::filesystem::create_directories(dir + "/pattern");
  {
    std::ofstream f(dir + "/pattern/full_attention_heads.tsv");
    for (int i = 0; i < 5; ++i) f << "0.1\t0.9\t1.5\t-2\n";  // clipped to [0, 1]
  }
  std::ofstream(dir + "/pattern/config.json") << R"({"sink_size": "four"})";
  CHECK_THAT(error_of("duo_attention:pattern=" + dir + "/pattern"),
             Catch::Contains("config.json") && Catch::Contains("sink_size"));
  std::ofstream(dir + "/pattern/config.json") << R"({"sink_size": 4, "recent_size": 16})";
  CHECK(error_of("duo_attention:pattern=" + dir + "/pattern", model.get()).empty());
}

TEST_CASE("kvscope policies lists the new policies with their parameters and defaults") {
  std::string out;
  REQUIRE(run_command("'" + kvscope_exe() + "' policies", &out) == 0);
  for (const char* s : {"tova", "snapkv", "pyramidkv", "knorm", "expected_attention", "adakv",
                        "duo_attention", "quest", "n_future", "page_size", "alpha"}) {
    INFO(s);
    CHECK_THAT(out, Catch::Contains(s));
  }
}

}  // namespace kvscope::test
