#include "capture/model/llama2c_loader.h"

#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "capture/formats/mapped_file.h"
#include "capture/model/mapped_tensor.h"
#include "capture/model/weight_builder.h"
#include "core/common/input_error.h"

namespace kvscope::model {

namespace {

constexpr uint32_t kMagicV1 = 0x616b3432;  // "ak42"

struct Header {
  int version = 0;  // 0: legacy run.c header, 1: ak42 v1
  // Read as int32, held as int64: the legacy header's vocab_size is negated
  // to say "unshared classifier", and -INT32_MIN does not fit an int32.
  int64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, seq_len = 0;
  bool shared_classifier = true;
  uint64_t weights_offset = 0;
};

struct Array {
  uint64_t offset = 0;
  std::vector<int64_t> shape;  // per layer for layered arrays
  bool layered = false;
};

Header read_header(const formats::MappedFile& f) {
  Header h;
  if (f.size() < 28)
    throw InputError(f.path(), "header", "file is too small for a llama2.c header");
  uint32_t magic;
  std::memcpy(&magic, f.data(), 4);
  const uint8_t* p = f.data();
  if (magic == kMagicV1) {
    if (f.size() < 256) throw InputError(f.path(), "header", "v1 header needs 256 bytes");
    int32_t version;
    std::memcpy(&version, p + 4, 4);
    if (version != 1)
      throw InputError(
          f.path(), "version",
          "llama2.c export version " + std::to_string(version) +
              " is not supported (expected the legacy format or version 1; v2 is Q8_0)");
    h.version = 1;
    p += 8;
  }
  int32_t v[7];
  std::memcpy(v, p, sizeof(v));
  h.dim = v[0], h.hidden = v[1], h.layers = v[2], h.heads = v[3], h.kv_heads = v[4];
  h.vocab = v[5], h.seq_len = v[6];
  if (h.version == 1) {
    h.shared_classifier = p[28] != 0;
    h.weights_offset = 256;
  } else {
    h.shared_classifier = h.vocab > 0;
    h.vocab = h.vocab < 0 ? -h.vocab : h.vocab;
    h.weights_offset = 28;
  }
  return h;
}

void check_header(const Header& h, const std::string& path) {
  auto positive = [&](const char* field, int64_t x, int64_t max) {
    if (x <= 0) throw InputError(path, field, "must be a positive size, got " + std::to_string(x));
    check_size(path, field, x, 1, max);
  };
  using L = ModelLimits;
  positive("dim", h.dim, L::kMaxHidden);
  positive("hidden_dim", h.hidden, L::kMaxIntermediate);
  positive("n_layers", h.layers, L::kMaxLayers);
  positive("n_heads", h.heads, L::kMaxHeads);
  positive("n_kv_heads", h.kv_heads, L::kMaxHeads);
  positive("vocab_size", h.vocab, L::kMaxVocab);
  positive("seq_len", h.seq_len, L::kMaxContext);
  if (h.dim % h.heads != 0)
    throw InputError(path, "n_heads", "must divide dim=" + std::to_string(h.dim));
  if (h.heads % h.kv_heads != 0)
    throw InputError(path, "n_kv_heads", "must divide n_heads=" + std::to_string(h.heads));
}

// Where each canonical tensor lives, and the total byte size implied
// (UINT64_MAX when it exceeds 64 bits: check_header allows dimensions up to
// 2^24, so vocab x dim x 4 x layers can, and a wrapped total could match the
// file size).
std::map<std::string, Array> layout(const Header& h, uint64_t* total) {
  const int64_t D = h.dim, F = h.hidden, L = h.layers, V = h.vocab, S = h.seq_len;
  const int64_t kv = D * h.kv_heads / h.heads, hd = D / h.heads;
  std::map<std::string, Array> a;
  uint64_t off = h.weights_offset;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool layered) {
    uint64_t bytes = 4;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) bytes = UINT64_MAX;
    if (layered && __builtin_mul_overflow(bytes, static_cast<uint64_t>(L), &bytes))
      bytes = UINT64_MAX;
    a[name] = {off, shape, layered};
    if (__builtin_add_overflow(off, bytes, &off)) off = UINT64_MAX;
  };
  if (h.version == 0) {
    add("token_embd.weight", {V, D}, false);
    add("attn_norm.weight", {D}, true);
    add("attn_q.weight", {D, D}, true);
    add("attn_k.weight", {kv, D}, true);
    add("attn_v.weight", {kv, D}, true);
    add("attn_output.weight", {D, D}, true);
    add("ffn_norm.weight", {D}, true);
    add("ffn_gate.weight", {F, D}, true);
    add("ffn_down.weight", {D, F}, true);
    add("ffn_up.weight", {F, D}, true);
    add("output_norm.weight", {D}, false);
    add("freq_cis_real", {S, hd / 2}, false);  // unused: RoPE is recomputed
    add("freq_cis_imag", {S, hd / 2}, false);
  } else {
    add("attn_norm.weight", {D}, true);
    add("ffn_norm.weight", {D}, true);
    add("output_norm.weight", {D}, false);
    add("token_embd.weight", {V, D}, false);
    add("attn_q.weight", {D, D}, true);
    add("attn_k.weight", {kv, D}, true);
    add("attn_v.weight", {kv, D}, true);
    add("attn_output.weight", {D, D}, true);
    add("ffn_gate.weight", {F, D}, true);
    add("ffn_down.weight", {D, F}, true);
    add("ffn_up.weight", {F, D}, true);
  }
  if (!h.shared_classifier) add("output.weight", {V, D}, false);
  *total = off;
  return a;
}

class Llama2cSource : public WeightSource {
 public:
  Llama2cSource(std::shared_ptr<formats::MappedFile> f, std::map<std::string, Array> arrays)
      : f_(std::move(f)), arrays_(std::move(arrays)) {}
  const std::string& file() const override { return f_->path(); }
  bool interleaved_qk() const override { return true; }
  std::string native_name(const std::string& canonical) const override { return canonical; }
  bool has(const std::string& canonical) const override { return locate(canonical) != nullptr; }
  torch::Tensor get(const std::string& canonical) override {
    int64_t layer = 0;
    const Array* a = locate(canonical, &layer);
    if (!a) throw InputError(f_->path(), canonical, "tensor is missing");
    int64_t n = 1;
    for (int64_t d : a->shape) n *= d;
    const uint64_t off = a->offset + static_cast<uint64_t>(layer * n * 4);
    return mapped_tensor(f_, f_->data() + off, a->shape, torch::kFloat32);
  }

 private:
  const Array* locate(const std::string& canonical, int64_t* layer = nullptr) const {
    std::string key = canonical;
    int64_t l = 0;
    if (key.rfind("blk.", 0) == 0) {
      size_t dot = key.find('.', 4);
      l = std::stoll(key.substr(4, dot - 4));
      key = key.substr(dot + 1);
    }
    auto it = arrays_.find(key);
    if (it == arrays_.end() || it->second.layered != (canonical.rfind("blk.", 0) == 0))
      return nullptr;
    if (layer) *layer = l;
    return &it->second;
  }
  std::shared_ptr<formats::MappedFile> f_;
  std::map<std::string, Array> arrays_;
};

ModelConfig config_from(const Header& h, const std::string& path) {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.source_format = "llama2.c";
  c.name = std::filesystem::path(path).stem().string();
  c.vocab_size = h.vocab;
  c.hidden_size = h.dim;
  c.intermediate_size = h.hidden;
  c.n_layers = h.layers;
  c.n_heads = h.heads;
  c.n_kv_heads = h.kv_heads;
  c.head_dim = h.dim / h.heads;
  c.context_length = h.seq_len;
  c.norm_eps = 1e-5;  // hard-coded in run.c
  c.tied_embeddings = h.shared_classifier;
  c.rope.theta = 10000.0;
  c.rope.dim = c.head_dim;
  c.sliding_window.assign(static_cast<size_t>(c.n_layers), 0);
  c.bos_token_id = 1;
  // TinyStories models delimit stories with BOS; run.c stops when it is
  // generated. EOS (2) ends a sequence too.
  c.eos_token_ids = {1, 2};
  c.validate(path);
  return c;
}

// The file holds exactly the arrays its header implies.
void check_size(const Header& h, uint64_t total, uint64_t file_size, const std::string& path) {
  if (total == file_size) return;
  throw InputError(
      path, "size",
      "file has " + std::to_string(file_size) + " bytes but the header (dim=" +
          std::to_string(h.dim) + ", hidden_dim=" + std::to_string(h.hidden) +
          ", n_layers=" + std::to_string(h.layers) + ", n_heads=" + std::to_string(h.heads) +
          ", n_kv_heads=" + std::to_string(h.kv_heads) + ", vocab_size=" + std::to_string(h.vocab) +
          ", seq_len=" + std::to_string(h.seq_len) + ") implies " + std::to_string(total));
}

}  // namespace

bool looks_like_llama2c(const std::string& path) {
  try {
    formats::MappedFile f(path);
    Header h = read_header(f);
    check_header(h, path);
    uint64_t total = 0;
    layout(h, &total);
    // A plausible header in a .bin file is a checkpoint even when the size
    // disagrees: the loader then says what the header implies (truncated?).
    const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
    return h.version == 1 || total == f.size() || bin;
  } catch (const InputError&) {
    return false;
  }
}

ModelConfig llama2c_model_config(const std::string& path) {
  formats::MappedFile f(path);
  Header h = read_header(f);
  check_header(h, path);
  uint64_t total = 0;
  layout(h, &total);
  check_size(h, total, f.size(), path);
  return config_from(h, path);
}

std::unique_ptr<Transformer> load_llama2c_model(const std::string& path,
                                                const torch::TensorOptions& target) {
  auto f = std::make_shared<formats::MappedFile>(path);
  Header h = read_header(*f);
  check_header(h, path);
  uint64_t total = 0;
  std::map<std::string, Array> arrays = layout(h, &total);
  check_size(h, total, f->size(), path);
  ModelConfig config = config_from(h, path);
  Llama2cSource source(f, std::move(arrays));
  ModelWeights weights = build_weights(config, source, target);
  return std::make_unique<Transformer>(std::move(config), std::move(weights));
}

}  // namespace kvscope::model
