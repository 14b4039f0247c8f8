#include "capture/train/train_data.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "capture/gates/gate_set.h"
#include "capture/generate/dense_kv_cache.h"
#include "capture/generate/generator.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<std::string> expand_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    if (!fs::exists(p)) throw InputError(p, "--data", "no such file or directory");
    if (fs::is_directory(p)) {
      std::vector<std::string> in_dir;
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) in_dir.push_back(e.path().string());
      std::sort(in_dir.begin(), in_dir.end());
      if (in_dir.empty()) throw InputError(p, "--data", "the directory holds no files");
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  return files;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "--data", "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.empty()) throw InputError(path, "--data", "empty file");
  if (s.find('\0') != std::string::npos)
    throw InputError(path, "--data",
                     "not plain text (NUL bytes; a .gz? decompress it, or build a corpus with "
                     "scripts/gates/make-corpus)");
  return s;
}

// Model-generated samples: each continues a prompt (a 16-token snippet of the
// text data, or just the BOS token when there is none) for up to `window`
// tokens, sampled at `temperature` with a per-sample seed. Kept as JSON lines
// {"prompt_ids", "ids", "text"} so a rerun (or --resume) reuses the very same
// tokens.
std::vector<std::vector<int32_t>> generated_samples(generate::Engine& engine, const DataOptions& o,
                                                    const std::vector<int32_t>& text_ids) {
  std::vector<std::vector<int32_t>> samples;
  int64_t have = 0;
  if (!o.generated_cache.empty() && fs::exists(o.generated_cache)) {
    std::ifstream in(o.generated_cache);
    std::string line;
    while (std::getline(in, line) && have < o.generate_tokens) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("ids"))
        throw InputError(o.generated_cache, "ids", "bad cache line");
      samples.push_back(j["ids"].get<std::vector<int32_t>>());
      have += int64_t(samples.back().size());
    }
    if (have >= o.generate_tokens) return samples;
  }
  std::ofstream cache;
  if (!o.generated_cache.empty()) cache.open(o.generated_cache, std::ios::app);
  const model::ModelConfig& c = engine.model->config();
  const int64_t cap =
      std::min<int64_t>(c.context_length > 0 ? c.context_length : 4096, o.window + 32);
  generate::DenseKvCache kv(c, cap, engine.device, engine.dtype);
  generate::Generator gen(*engine.model, kv, engine.tokenizer.get());
  const int32_t bos = engine.tokenizer->bos_id();
  for (uint64_t k = samples.size(); have < o.generate_tokens; ++k) {
    std::mt19937_64 rng(o.seed * 1000003ULL + k);
    std::vector<int32_t> prompt;
    if (bos >= 0) prompt.push_back(bos);
    if (text_ids.size() > 64) {
      size_t at = size_t(rng() % (text_ids.size() - 32));
      for (size_t i = at; i < at + 16; ++i)
        if (text_ids[i] != bos) prompt.push_back(text_ids[i]);
    }
    if (prompt.empty()) prompt.push_back(0);
    generate::GenerationOptions g;
    g.max_new_tokens = o.window;
    g.sampling.greedy = false;
    g.sampling.temperature = o.temperature;
    g.sampling.seed = o.seed * 1000003ULL + k;
    kv.reset();
    generate::GenerationResult r = gen.run(prompt, g);
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), r.output_ids.begin(), r.output_ids.end());
    if (cache.is_open())
      cache << json{{"prompt_ids", prompt}, {"ids", ids}, {"text", engine.tokenizer->decode(ids)}}
                   .dump()
            << std::endl;
    have += int64_t(ids.size());
    samples.push_back(std::move(ids));
  }
  return samples;
}

}  // namespace

TokenData load_training_data(generate::Engine& engine, const DataOptions& o) {
  if (!engine.tokenizer)
    throw InputError("", "--tokenizer", "training needs the model's tokenizer");
  if (o.paths.empty() && o.generate_tokens <= 0)
    throw InputError("", "--data",
                     "give text files (--data) and/or model-generated tokens (--generate N)");
  TokenData out;
  out.describe = {{"files", json::array()}};
  std::vector<std::vector<int32_t>> sources;
  std::vector<int32_t> all_text;
  int64_t text_tokens = 0, text_bytes = 0;
  for (const std::string& f : expand_paths(o.paths)) {
    std::string text = read_text(f);
    std::vector<int32_t> ids = engine.tokenizer->encode(text, /*add_special=*/true);
    out.describe["files"].push_back(
        {{"path", f}, {"bytes", text.size()}, {"tokens", ids.size()}, {"sha256", file_sha256(f)}});
    text_tokens += int64_t(ids.size());
    text_bytes += int64_t(text.size());
    all_text.insert(all_text.end(), ids.begin(), ids.end());
    sources.push_back(std::move(ids));
  }
  out.describe["text_tokens"] = text_tokens;
  out.describe["text_bytes"] = text_bytes;
  if (o.generate_tokens > 0) {
    std::vector<std::vector<int32_t>> gen = generated_samples(engine, o, all_text);
    std::vector<int32_t> g;
    for (auto& s : gen) g.insert(g.end(), s.begin(), s.end());
    out.describe["generated"] = {
        {"tokens", g.size()},
        {"samples", gen.size()},
        {"temperature", o.temperature},
        {"seed", o.seed},
        {"prompts", all_text.empty() ? "BOS only" : "16-token snippets of the text data"},
        {"cache", o.generated_cache}};
    sources.push_back(std::move(g));
  }
  // Each source gives its tail to the held-out part, so both halves mix the
  // sources in the same proportions.
  std::vector<int32_t> held;
  for (const auto& s : sources) {
    const size_t cut = size_t(double(s.size()) * (1.0 - o.holdout));
    out.ids.insert(out.ids.end(), s.begin(), s.begin() + cut);
    held.insert(held.end(), s.begin() + cut, s.end());
  }
  out.train_end = int64_t(out.ids.size());
  out.ids.insert(out.ids.end(), held.begin(), held.end());
  out.describe["train_tokens"] = out.train_end;
  out.describe["heldout_tokens"] = held.size();
  if (out.train_end < o.window + 1 || int64_t(held.size()) < o.window + 1)
    throw InputError("", "--data",
                     "too little text: " + std::to_string(out.ids.size()) +
                         " tokens cannot fill a " + std::to_string(o.window + 1) +
                         "-token training window and a held-out one (" +
                         std::to_string(int(o.holdout * 100)) + "% held out)");
  return out;
}

}  // namespace kvscope::gates
