// The registry: every registered policy and wrapper has a paper, a doc page
// that names each of its parameters, and a row in docs/policies/README.md.
// Adding a policy without its page fails here.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void check_entry(const std::string& name, const std::string& paper, const std::string& doc,
                 const std::vector<policy::ParamSpec>& params, const std::string& index) {
  INFO(name << " (" << doc << ")");
  CHECK(!paper.empty());
  REQUIRE(std::filesystem::exists(source_dir() + "/" + doc));
  const std::string page = read_text(source_dir() + "/" + doc);
  for (const policy::ParamSpec& p : params) {
    INFO("parameter " << p.name);
    CHECK(page.find("`" + p.name + "`") != std::string::npos);
  }
  CHECK(index.find("`" + name + "`") != std::string::npos);
}

}  // namespace

TEST_CASE("every registered policy and wrapper has its paper, doc page, parameters and index row",
          "[registry]") {
  const std::string index = read_text(source_dir() + "/docs/policies/README.md");
  REQUIRE(!index.empty());
  for (const policy::PolicyDescriptor& d : policy::builtin_policies())
    check_entry(d.name, d.paper, d.doc, d.params, index);
  for (const policy::WrapperDescriptor& d : policy::builtin_wrappers())
    check_entry(d.name, d.paper, d.doc, d.params, index);
}

TEST_CASE("docs/policies/README.md's index is the registry's (kvscope policies --markdown)",
          "[registry]") {
  const std::string index = read_text(source_dir() + "/docs/policies/README.md");
  const size_t begin = index.find("<!-- registry:begin");
  const size_t end = index.find("<!-- registry:end -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const size_t body = index.find('\n', begin) + 1;
  std::string generated;
  REQUIRE(run_command(kvscope_exe() + " policies --markdown", &generated) == 0);
  INFO("regenerate the block with `kvscope policies --markdown`");
  CHECK(index.substr(body, end - body) == generated);
}

TEST_CASE("policy and wrapper names are unique and every policy builds with its defaults",
          "[registry]") {
  std::set<std::string> names;
  for (const policy::PolicyDescriptor& d : policy::builtin_policies())
    CHECK(names.insert(d.name).second);
  for (const policy::WrapperDescriptor& d : policy::builtin_wrappers())
    CHECK((names.insert(d.name).second || d.name == "adakv"));  // adakv: policy and wrapper
  for (const policy::PolicyDescriptor& d : policy::builtin_policies()) {
    bool needs_file = false;
    for (const policy::ParamSpec& p : d.params)
      needs_file |=
          p.type == policy::ParamType::String && p.default_value.empty() &&
          (p.name == "gates" || p.name == "file" || p.name == "pattern" || p.name == "curve");
    if (needs_file) continue;  // learned, scripted and LU-KV policies need their file
    INFO(d.name);
    CHECK_NOTHROW(policy::make_policy(d.name));
  }
}

TEST_CASE("learned policies given no gates= take the gate shipped for the model and say so",
          "[registry][gates]") {
  const std::string stories = shared_dir() + "/models/stories260K/stories260K.bin";
  for (const auto& [spec, file] : std::vector<std::pair<std::string, std::string>>{
           {"wgkv", "stories260K-wgkv.safetensors"},
           {"attention_gate", "stories260K-attention-gate.safetensors"},
           {"trimkv:budget=8", "stories260K-retention.safetensors"},
           {"dbtrimkv:budget=8", "stories260K-retention-global.safetensors"}}) {
    INFO(spec);
    policy::PolicyInstance pi = policy::make_policy(spec, {0, stories});
    REQUIRE(pi.notes.size() == 1);
    CHECK_THAT(pi.notes[0], Catch::Contains(file) && Catch::Contains("no gates= given"));
    CHECK_THAT(pi.params_json, Catch::Contains(file));  // the trace's /run says which
  }
  // A given gates= is kept; a model nobody trained a gate for is refused.
  policy::PolicyInstance given = policy::make_policy(
      "wgkv:gates=" + source_dir() + "/resources/gates/stories260K-wgkv.safetensors", {0, stories});
  CHECK(given.notes.empty());
  const std::string other = temp_dir() + "/other-model.bin";
  std::ofstream(other) << "not a model anyone trained a gate for";
  try {
    policy::make_policy("wgkv", {0, other});
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("wgkv:gates") &&
                                          Catch::Contains("no shipped gate") &&
                                          Catch::Contains("kvscope train --policy wgkv"));
  }
}

TEST_CASE("the trace records the command and the parameters a learned policy resolved",
          "[registry][gates][cli]") {
  const std::string stories = shared_dir() + "/models/stories260K/";
  const std::string trace = temp_dir() + "/wgkv.kvtrace.h5";
  std::string out;
  REQUIRE(run_command(kvscope_exe() + " capture --model " + stories +
                          "stories260K.bin --tokenizer " + stories +
                          "tok512.bin --prompt 'Tom had a big dog' --max-new 4" +
                          " --policy wgkv+quest:budget=8,page_size=4 -q -o " + trace,
                      &out) == 0);
  CHECK_THAT(out, Catch::Contains("kvscope: note: wgkv: no gates= given"));
  auto r = trace::TraceReader::open(trace);
  CHECK_THAT(r->run().command_line, Catch::Contains("--policy wgkv+quest:budget=8,page_size=4"));
  const nlohmann::json params = nlohmann::json::parse(r->run().policy_params_json);
  const nlohmann::json& wgkv = params["parts"][0]["params"];
  // The shipped stories260K gate was trained with tau 0.1 and window 32
  // (resources/gates/stories260K-wgkv.json), not the placeholders -1 and 0.
  CHECK(wgkv["tau"].get<double>() == Approx(0.1));
  CHECK(wgkv["window"].get<int64_t>() == 32);
  CHECK_THAT(wgkv["gates"].get<std::string>(), Catch::EndsWith("stories260K-wgkv.safetensors"));
}

}  // namespace kvscope::test
