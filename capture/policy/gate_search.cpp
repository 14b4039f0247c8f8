// Learned policies given no `gates=`: the shipped gate trained for the model.
// Each gate file's JSON metadata names its kind ("policy") and the weight
// file it was trained on ("base_model": {"sha256": ...}); a gate matches when
// both agree. Searched: $KVSCOPE_GATES_DIR, else the checkout's
// resources/gates (compiled in).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "capture/policy/registry.h"

namespace kvscope::policy {

namespace {

std::string gates_dir() {
  const char* env = std::getenv("KVSCOPE_GATES_DIR");
  return env && *env ? env : KVSCOPE_SHIPPED_GATES_DIR;
}

// The metadata's kind if it names the model, else "".
std::string kind_for_model(const std::filesystem::path& json_path, const std::string& sha256) {
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "kvscope-gates") return "";
  const nlohmann::json& base = j.contains("base_model") ? j["base_model"] : nlohmann::json();
  if (!base.is_object() || base.value("sha256", "") != sha256) return "";
  return j.value("policy", "");
}

}  // namespace

std::string find_shipped_gate(const std::vector<std::string>& kinds,
                              const std::string& model_sha256) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> metadata;
  for (const fs::directory_entry& e : fs::directory_iterator(gates_dir(), ec))
    if (e.path().extension() == ".json") metadata.push_back(e.path());
  std::sort(metadata.begin(), metadata.end());  // the same choice on every machine
  for (const std::string& kind : kinds)         // in the policy's order of preference
    for (const fs::path& m : metadata) {
      fs::path weights = m;
      weights.replace_extension(".safetensors");
      if (kind_for_model(m, model_sha256) == kind && fs::exists(weights)) return weights.string();
    }
  return "";
}

}  // namespace kvscope::policy
