// kvscope model-info PATH [--json]: architecture, sizes, storage dtypes,
// tokenizer kind and context length of a model, read without running it.
#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/engine.h"
#include "capture/model/model_loader.h"
#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

struct ModelInfoOptions {
  std::string path;
  std::string tokenizer;
  bool json = false;
};

std::string first_line(const std::string& s, size_t max = 80) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > max ? line.substr(0, max) + "..." : line;
}

int run_model_info(const ModelInfoOptions& o) {
  const model::ModelFileInfo info = model::inspect_model(o.path);
  const model::ModelConfig& c = info.config;
  std::string tokenizer_kind, tokenizer_source;
  try {
    auto tok =
        generate::open_tokenizer(o.path, info.format, o.tokenizer, c.vocab_size, &tokenizer_source);
    tokenizer_kind = tok ? tok->kind() : "none";
  } catch (const InputError& e) {
    tokenizer_kind = std::string("unreadable: ") + e.what();
  }
  std::ostringstream types;
  for (const auto& [type, n] : info.storage_types)
    types << (types.tellp() ? ", " : "") << type << " x" << n;

  if (o.json) {
    nlohmann::json j;
    j["path"] = info.path;
    j["format"] = model::model_format_name(info.format);
    j["name"] = c.name;
    j["architecture"] = model::architecture_name(c.arch);
    j["n_layers"] = c.n_layers;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    if (c.moe.n_experts > 0) {
      std::vector<int64_t> sparse;
      for (int64_t l = 0; l < c.n_layers; ++l)
        if (c.moe_layer(l)) sparse.push_back(l);
      j["moe"] = {{"n_experts", c.moe.n_experts},
                  {"experts_per_token", c.moe.top_k},
                  {"expert_intermediate_size", c.moe.intermediate_size},
                  {"normalize_top_k", c.moe.normalize_top_k},
                  {"layers", sparse}};
    }
    j["n_heads"] = c.n_heads;
    j["n_kv_heads"] = c.n_kv_heads;
    j["head_dim"] = c.head_dim;
    j["vocab_size"] = c.vocab_size;
    j["context_length"] = c.context_length;
    j["tied_embeddings"] = c.tied_embeddings;
    j["rope_theta"] = c.rope.enabled ? nlohmann::json(c.rope.theta) : nlohmann::json(nullptr);
    j["rope_scaling"] = model::rope_scaling_name(c.rope.scaling);
    j["parameters"] = info.parameter_count;
    j["tensors"] = info.tensor_count;
    j["storage_types"] = info.storage_types;
    j["file_bytes"] = info.file_bytes;
    j["tokenizer"] = {{"kind", tokenizer_kind}, {"source", tokenizer_source}};
    j["chat_template"] = !info.chat_template.empty();
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "model          " << info.path << " (" << model::model_format_name(info.format)
            << ")\n";
  std::cout << "name           " << c.name << "\n";
  std::cout << c.describe();
  std::cout << "parameters     " << info.parameter_count << " in " << info.tensor_count
            << " tensors (" << std::fixed << std::setprecision(1)
            << static_cast<double>(info.file_bytes) / (1 << 20) << " MiB on disk)\n";
  std::cout << "storage        " << types.str() << "\n";
  std::cout << "tokenizer      " << tokenizer_kind << " (" << tokenizer_source << ")\n";
  std::cout << "chat template  "
            << (info.chat_template.empty() ? "none" : first_line(info.chat_template)) << "\n";
  return kExitOk;
}

Command add_model_info_command(CLI::App& app) {
  auto opt = std::make_shared<ModelInfoOptions>();
  CLI::App* sub = app.add_subcommand("model-info", engine_summary("model-info"));
  sub->add_option("PATH", opt->path, "HF directory, .gguf or llama2.c .bin")->required();
  sub->add_option("--tokenizer", opt->tokenizer, "tokenizer to report instead of the model's own");
  sub->add_flag("--json", opt->json, "print JSON");
  return {sub, [opt] { return run_model_info(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("model-info", add_model_info_command);

}  // namespace kvscope::cli
