#include "capture/generate/engine.h"

#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "capture/formats/gguf.h"
#include "core/common/input_error.h"
#include "core/common/thread_count.h"
#include "kernels/parallel.h"

namespace kvscope::generate {

namespace fs = std::filesystem;

torch::Device parse_device(const std::string& device) {
  if (device == "cpu") return torch::kCPU;
  if (device != "cuda" && device.rfind("cuda:", 0) != 0)
    throw InputError("", "--device", "\"" + device + "\" (expected cpu, cuda or cuda:N)");
  // The spelling first, so "cuda:" or "cuda:x" is refused on any machine.
  const bool indexed = device != "cuda";
  int64_t index = 0;
  if (indexed) {
    const std::string digits = device.substr(5);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
        digits.size() > 4)
      throw InputError("", "--device",
                       "\"" + device + "\" (expected cuda or cuda:N, N a device number)");
    index = std::stoll(digits);
  }
  if (!torch::cuda::is_available())
    throw InputError("", "--device",
                     "\"" + device +
                         "\" requested but no CUDA device is available (this machine has no "
                         "usable GPU, or this LibTorch is built without CUDA: Debian's libtorch "
                         "is CPU-only); use --device cpu");
  const int64_t count = int64_t(torch::cuda::device_count());
  if (index >= count)
    throw InputError("", "--device",
                     "\"" + device + "\" requested but this machine has " + std::to_string(count) +
                         " CUDA device" + (count == 1 ? "" : "s") +
                         " (cuda:0 .. cuda:" + std::to_string(count - 1) + ")");
  // "cuda" stays the current device (the trace's /run device says "cuda").
  return indexed ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index))
                 : torch::Device(torch::kCUDA);
}

const char* dtype_name(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return "fp32";
    case torch::kBFloat16: return "bf16";
    case torch::kFloat16: return "fp16";
    default: return "?";
  }
}

torch::ScalarType parse_dtype(const std::string& dtype, torch::Device device) {
  torch::ScalarType t;
  if (dtype == "fp32" || dtype == "float32")
    t = torch::kFloat32;
  else if (dtype == "bf16" || dtype == "bfloat16")
    t = torch::kBFloat16;
  else if (dtype == "fp16" || dtype == "float16")
    t = torch::kFloat16;
  else
    throw InputError("", "--dtype", "\"" + dtype + "\" (expected fp32, bf16 or fp16)");
  if (t == torch::kFloat32) return t;
  // Ask the build rather than guess: LibTorch 1.13 has no fp16 matmul on CPU.
  try {
    torch::NoGradGuard no_grad;
    auto o = torch::TensorOptions().dtype(t).device(device);
    torch::Tensor a = torch::ones({2, 2}, o);
    (void)torch::mm(a, a).sum().item<float>();
    (void)torch::softmax(a.to(torch::kFloat32), -1).to(t).sum().item<float>();
  } catch (const c10::Error&) {
    throw InputError("", "--dtype",
                     std::string(dtype_name(t)) + " is not supported on " + device.str() +
                         " by this LibTorch build (matrix multiply unavailable); use fp32" +
                         (device.is_cpu() && t == torch::kFloat16 ? " or bf16" : ""));
  }
  return t;
}

torch::ScalarType parse_kv_dtype(const std::string& kv_dtype, torch::ScalarType weights) {
  if (kv_dtype.empty()) return weights;
  if (kv_dtype == "fp32" || kv_dtype == "float32") return torch::kFloat32;
  if (kv_dtype == "bf16" || kv_dtype == "bfloat16") return torch::kBFloat16;
  if (kv_dtype == "fp16" || kv_dtype == "float16") return torch::kFloat16;
  throw InputError("", "--kv-dtype", "\"" + kv_dtype + "\" (expected fp32, bf16 or fp16)");
}

void set_threads(int threads) {
  if (threads < 0)
    throw InputError("", "--threads", "must be positive (0: OMP_NUM_THREADS, else one per core)");
  // 0: OMP_NUM_THREADS, else one per core, split between the pools as below
  // (LibTorch's and OpenBLAS's defaults, both one per core, would stall each
  // other).
  if (threads == 0) threads = default_thread_count();
  // Debian's LibTorch runs matrix products on OpenBLAS. Its OpenMP build
  // (libopenblas0-openmp) shares LibTorch's OpenMP pool, so both get the
  // threads. Its pthreads build has a worker pool of its own; both pools spin
  // while idle, and with both sized to the core count they take turns
  // stalling each other (measured on 2 cores: decode at 512 tokens of
  // context 20 tok/s with one thread, 3 tok/s with two), so there the BLAS
  // pool gets the threads and LibTorch's element-wise ops run on the
  // caller's thread. Without OpenBLAS (pip's torch: MKL and oneDNN on
  // LibTorch's OpenMP pool) LibTorch gets them, and the kernels' items run on
  // that pool too (kernels/parallel.h).
  kernels::set_blas_threads(threads);
  torch::set_num_threads(kernels::blas_has_own_pool() ? 1 : threads);
  // The kernels' workers sleep when idle, so they can share the cores with
  // either pool (kernels/parallel.h).
  kernels::set_kernel_threads(threads);
}

// glibc serves allocations above its mmap threshold (128 KiB, raised
// dynamically up to 32 MiB) with fresh mmaps, returned on free: every
// forward's activation and score buffers then come back as new pages, each
// faulted in and zeroed by the kernel (page faults were ~2 % of a prefill's
// samples, more of its time). Keeping them in the heap: SmolLM2 fp32, 512-token
// prefill 1013-1069 -> 1184-1287 tokens/s (docs/performance.md). The freed
// memory stays with the process until it exits, which suits a capture run.
void keep_buffers_in_heap() {
  constexpr int kMmapThreshold = 256 << 20, kTrimThreshold = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
}

std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const std::string& model_path,
                                                     model::ModelFormat format,
                                                     const std::string& explicit_path,
                                                     int64_t vocab_size, std::string* source) {
  if (!explicit_path.empty()) {
    if (!fs::exists(explicit_path))
      throw InputError(explicit_path, "--tokenizer", "file does not exist");
    *source = explicit_path;
    return tokenizer::Tokenizer::load(explicit_path, vocab_size);
  }
  const std::string root = model::model_root(model_path, format);
  switch (format) {
    case model::ModelFormat::HfDirectory: {
      const fs::path json = fs::path(root) / "tokenizer.json";
      if (fs::is_regular_file(json)) {
        *source = json.string();
        return tokenizer::Tokenizer::from_tokenizer_json(json.string());
      }
      *source = "none (no tokenizer.json in " + root + ")";
      return nullptr;
    }
    case model::ModelFormat::Gguf: {
      formats::GgufFile gguf(model_path);
      if (gguf.has("tokenizer.ggml.tokens")) {
        *source =
            model_path + " (embedded " + gguf.get_string_or("tokenizer.ggml.model", "?") + ")";
        return tokenizer::Tokenizer::from_gguf(gguf);
      }
      *source = "none (the GGUF holds no tokenizer.ggml.tokens)";
      return nullptr;
    }
    case model::ModelFormat::Llama2c: {
      const fs::path bin = fs::path(model_path).parent_path() / "tokenizer.bin";
      if (fs::is_regular_file(bin)) {
        *source = bin.string();
        return tokenizer::Tokenizer::from_llama2c(bin.string(), vocab_size);
      }
      *source = "none (no tokenizer.bin beside the checkpoint; pass --tokenizer)";
      return nullptr;
    }
  }
  return nullptr;
}

Engine open_engine(const ModelOptions& o) {
  if (o.model.empty()) throw InputError("", "--model", "a model path is required");
  Engine e;
  e.device = parse_device(o.device);
  e.dtype = parse_dtype(o.dtype, e.device);
  e.kv_dtype = parse_kv_dtype(o.kv_dtype, e.dtype);
  set_threads(o.threads);
  keep_buffers_in_heap();
  e.format = model::detect_model_format(o.model);
  const auto start = std::chrono::steady_clock::now();
  e.model = model::load_model(o.model, torch::TensorOptions().dtype(e.dtype).device(e.device));
  e.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  e.tokenizer = open_tokenizer(o.model, e.format, o.tokenizer, e.model->config().vocab_size,
                               &e.tokenizer_source);
  return e;
}

}  // namespace kvscope::generate
