#include "capture/model/model_writer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "capture/model/hf_loader.h"
#include "core/common/atomic_file.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace fs = std::filesystem;

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// The inverse of interleaved_to_rotate_half (weight_builder.h): within each
// head, rotate-half row j*d/2 + i goes back to Meta row 2i + j.
torch::Tensor rotate_half_to_interleaved(const torch::Tensor& w, int64_t n_heads,
                                         int64_t head_dim) {
  std::vector<int64_t> split = {n_heads, 2, head_dim / 2};
  split.insert(split.end(), w.sizes().begin() + 1, w.sizes().end());
  return w.reshape(split).transpose(1, 2).reshape(w.sizes()).contiguous();
}

struct Layout {
  bool interleaved_qk = false;  // llama2.c
  bool conv1d = false;          // HF GPT-2
};

torch::Tensor rows(const torch::Tensor& t, int64_t from, int64_t n) {
  return t.defined() ? t.narrow(0, from, n) : t;
}

// q, k, v (and biases) out of the fused wqkv, in the file's row order.
void attention_tensors(const ModelConfig& c, const LayerWeights& w, const std::string& p,
                       Layout lay, Named* out) {
  if (c.arch == Architecture::Phi3) {  // fused as stored
    out->push_back({p + "attn_qkv.weight", w.wqkv});
    out->push_back({p + "attn_output.weight", w.wo});
    return;
  }
  if (c.arch == Architecture::Gpt2) {
    out->push_back({p + "attn_qkv.weight", lay.conv1d ? w.wqkv.t() : w.wqkv});
    out->push_back({p + "attn_qkv.bias", w.bqkv});
    out->push_back({p + "attn_output.weight", lay.conv1d ? w.wo.t() : w.wo});
    out->push_back({p + "attn_output.bias", w.bo});
    return;
  }
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  auto qk = [&](const torch::Tensor& t, int64_t heads) {
    return lay.interleaved_qk && t.defined() ? rotate_half_to_interleaved(t, heads, c.head_dim) : t;
  };
  out->push_back({p + "attn_q.weight", qk(rows(w.wqkv, 0, qd), c.n_heads)});
  out->push_back({p + "attn_k.weight", qk(rows(w.wqkv, qd, kvd), c.n_kv_heads)});
  out->push_back({p + "attn_v.weight", rows(w.wqkv, qd + kvd, kvd)});
  out->push_back({p + "attn_q.bias", qk(rows(w.bqkv, 0, qd), c.n_heads)});
  out->push_back({p + "attn_k.bias", qk(rows(w.bqkv, qd, kvd), c.n_kv_heads)});
  out->push_back({p + "attn_v.bias", rows(w.bqkv, qd + kvd, kvd)});
  out->push_back({p + "attn_q_norm.weight", w.q_norm});
  out->push_back({p + "attn_k_norm.weight", w.k_norm});
  out->push_back({p + "attn_output.weight", w.wo});
  out->push_back({p + "attn_output.bias", w.bo});
}

// The router and one tensor per expert and projection (the HF checkpoint
// layout; GGUF's stacked tensors are read, never written).
void moe_tensors(const ModelConfig& c, const LayerWeights& w, const std::string& p, Named* out) {
  const int64_t I = c.moe.intermediate_size;
  out->push_back({p + "ffn_gate_inp.weight", w.router});
  for (int64_t e = 0; e < c.moe.n_experts; ++e) {
    const std::string x = "." + std::to_string(e) + ".weight";
    const torch::Tensor up = w.experts_up.select(0, e);
    out->push_back({p + "ffn_gate_exps" + x, up.narrow(0, 0, I)});
    out->push_back({p + "ffn_up_exps" + x, up.narrow(0, I, I)});
    out->push_back({p + "ffn_down_exps" + x, w.experts_down.select(0, e)});
  }
}

void mlp_tensors(const ModelConfig& c, const LayerWeights& w, const std::string& p, Layout lay,
                 Named* out) {
  if (w.router.defined()) return moe_tensors(c, w, p, out);
  if (c.mlp == MlpKind::GeluTanh) {
    out->push_back({p + "ffn_up.weight", lay.conv1d ? w.w_up.t() : w.w_up});
    out->push_back({p + "ffn_up.bias", w.b_up});
    out->push_back({p + "ffn_down.weight", lay.conv1d ? w.w_down.t() : w.w_down});
    out->push_back({p + "ffn_down.bias", w.b_down});
    return;
  }
  if (c.arch == Architecture::Phi3) {  // gate_up_proj fused as stored
    out->push_back({p + "ffn_up.weight", w.w_up});
    out->push_back({p + "ffn_down.weight", w.w_down});
    return;
  }
  const int64_t I = c.intermediate_size;
  out->push_back({p + "ffn_gate.weight", rows(w.w_up, 0, I)});
  out->push_back({p + "ffn_up.weight", rows(w.w_up, I, I)});
  out->push_back({p + "ffn_gate.bias", rows(w.b_up, 0, I)});
  out->push_back({p + "ffn_up.bias", rows(w.b_up, I, I)});
  out->push_back({p + "ffn_down.weight", w.w_down});
  out->push_back({p + "ffn_down.bias", w.b_down});
}

// Every stored tensor under its canonical (GGUF-style) name, in the file's
// layout, float32 and contiguous; absent ones left out.
Named canonical_tensors(const Transformer& m, Layout lay) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  Named all = {{"token_embd.weight", w.embed}, {"position_embd.weight", w.pos_embed}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    all.push_back({p + "attn_norm.weight", lw.attn_norm});
    all.push_back({p + "attn_norm.bias", lw.attn_norm_bias});
    attention_tensors(c, lw, p, lay, &all);
    all.push_back({p + "ffn_norm.weight", lw.ffn_norm});
    all.push_back({p + "ffn_norm.bias", lw.ffn_norm_bias});
    mlp_tensors(c, lw, p, lay, &all);
  }
  all.push_back({"output_norm.weight", w.final_norm});
  all.push_back({"output_norm.bias", w.final_norm_bias});
  // Tied models store the embedding once; the loaders tie lm_head to it.
  if (!c.tied_embeddings) all.push_back({"output.weight", w.lm_head});
  Named out;
  for (auto& [name, t] : all)
    if (t.defined()) out.push_back({name, t.detach().to(torch::kFloat32).cpu().contiguous()});
  return out;
}

void write_floats(std::ostream& out, const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kFloat32).cpu().contiguous();
  out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.numel() * 4));
}

// Why run.c cannot hold this model, or "" when it can.
std::string llama2c_obstacle(const ModelConfig& c) {
  if (c.arch != Architecture::Llama)
    return std::string(architecture_name(c.arch)) + " architecture";
  if (c.norm != NormKind::RmsNorm || c.norm_eps != 1e-5)
    return "a norm other than RMSNorm eps 1e-5";
  if (c.mlp != MlpKind::SwiGlu) return "a non-SwiGLU MLP";
  if (c.moe.n_experts > 0) return "a mixture of experts";
  if (c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm) return "biases or q/k norms";
  if (!c.rope.enabled || c.rope.theta != 10000.0 || c.rope.dim != c.head_dim ||
      c.rope.scaling != RopeConfig::Scaling::None || !c.rope.freq_divisors.empty())
    return "RoPE other than base 10000 over the whole head";
  for (int64_t w : c.sliding_window)
    if (w != 0) return "a sliding window";
  return "";
}

// run.c's legacy RoPE tables as llama2.c's precompute_freqs_cis builds them
// (unused by the loader, which recomputes RoPE; written so run.c reads the file).
std::pair<torch::Tensor, torch::Tensor> llama2c_freqs(int64_t hd, int64_t seq_len) {
  torch::Tensor f = torch::arange(0, hd, 2, torch::kInt64).to(torch::kFloat32) / double(hd);
  f = 1.0 / torch::pow(torch::tensor(10000.0f), f);
  torch::Tensor a = torch::outer(torch::arange(seq_len, torch::kInt64).to(torch::kFloat32), f);
  return {torch::cos(a), torch::sin(a)};
}

}  // namespace

void write_llama2c(const Transformer& m, const std::string& path) {
  const ModelConfig& c = m.config();
  const std::string why = llama2c_obstacle(c);
  if (!why.empty())
    throw InputError(path, "model",
                     c.name + " has " + why +
                         ": it cannot be written as a llama2.c checkpoint (expected a llama2.c "
                         "model or a Hugging Face directory to write back to)");
  Named named = canonical_tensors(m, Layout{true, false});
  std::map<std::string, torch::Tensor> t(named.begin(), named.end());
  auto layered = [&](const char* name) {
    std::vector<torch::Tensor> per;
    for (int64_t l = 0; l < c.n_layers; ++l)
      per.push_back(t.at("blk." + std::to_string(l) + "." + name));
    return per;
  };
  const int32_t header[7] = {
      int32_t(c.hidden_size),   int32_t(c.intermediate_size),
      int32_t(c.n_layers),      int32_t(c.n_heads),
      int32_t(c.n_kv_heads),    int32_t(c.tied_embeddings ? c.vocab_size : -c.vocab_size),
      int32_t(c.context_length)};
  // A pair, not a structured binding: C++17 lambdas cannot capture bindings.
  const auto freqs = llama2c_freqs(c.head_dim, c.context_length);
  write_stream_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    write_floats(out, t.at("token_embd.weight"));
    for (const char* name : {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                             "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
                             "ffn_down.weight", "ffn_up.weight"})
      for (const torch::Tensor& x : layered(name)) write_floats(out, x);
    write_floats(out, t.at("output_norm.weight"));
    write_floats(out, freqs.first);
    write_floats(out, freqs.second);
    if (!c.tied_embeddings) write_floats(out, t.at("output.weight"));
  });
}

namespace {

void write_safetensors(const std::string& path, const Named& tensors) {
  nlohmann::json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t nbytes = uint64_t(t.numel()) * 4;
    header[name] = {
        {"dtype", "F32"}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes
  write_stream_atomically(path, [&](std::ostream& out) {
    char len[8];
    for (int k = 0; k < 8; ++k) len[k] = char((uint64_t(h.size()) >> (8 * k)) & 0xff);
    out.write(len, 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (const auto& [name, t] : tensors) write_floats(out, t);
  });
}

// The source's config.json with the dtype of what is written now.
void write_config(const std::string& source_dir, const std::string& dir) {
  const std::string src = (fs::path(source_dir) / "config.json").string();
  std::ifstream in(src);
  if (!in) throw InputError(src, "", "cannot open");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) throw InputError(src, "", "a JSON object expected");
  bool set = false;
  for (const char* key : {"torch_dtype", "dtype"})
    if (j.contains(key)) {
      j[key] = "float32";
      set = true;
    }
  if (!set) j["torch_dtype"] = "float32";
  const std::string path = (fs::path(dir) / "config.json").string();
  write_stream_atomically(path, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

}  // namespace

void write_hf_directory(const Transformer& m, const std::string& source_dir,
                        const std::string& dir) {
  const ModelConfig& c = m.config();
  const bool gpt2 = c.arch == Architecture::Gpt2;
  fs::create_directories(dir);
  Named named;
  for (auto& [canonical, t] : canonical_tensors(m, Layout{false, gpt2})) {
    const std::string name = hf_name(canonical, c.arch);
    named.push_back(
        {canonical == "output.weight" ? name : (gpt2 ? "transformer." : "model.") + name, t});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), named);
  write_config(source_dir, dir);
  // The tokenizer travels with the model (capture finds it beside the weights).
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt"}) {
    const fs::path from = fs::path(source_dir) / f;
    if (fs::is_regular_file(from))
      fs::copy_file(from, fs::path(dir) / f, fs::copy_options::overwrite_existing);
  }
}

std::string write_model_like(const Transformer& m, const std::string& source,
                             const std::string& out, const std::string& option) {
  const ModelFormat format = detect_model_format(source);
  switch (format) {
    case ModelFormat::Llama2c: write_llama2c(m, out); return out;
    case ModelFormat::HfDirectory:
      write_hf_directory(m, model_root(source, format), out);
      return (fs::path(out) / "model.safetensors").string();
    case ModelFormat::Gguf: break;
  }
  throw InputError(source, option,
                   "a GGUF model cannot be written back after fine-tuning (KVScope reads GGUF, it "
                   "does not write it; expected a llama2.c .bin or a Hugging Face directory)");
}

}  // namespace kvscope::model
