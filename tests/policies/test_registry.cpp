// The registry: every registered policy and wrapper has a paper, a doc page
// that names each of its parameters, and a row in docs/policies/README.md.
// Adding a policy without its page fails here.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

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
      needs_file |= p.type == policy::ParamType::String && p.default_value.empty() &&
                    (p.name == "gates" || p.name == "file" || p.name == "pattern");
    if (needs_file) continue;  // learned and scripted policies need their file
    INFO(d.name);
    CHECK_NOTHROW(policy::make_policy(d.name));
  }
}

}  // namespace kvscope::test
