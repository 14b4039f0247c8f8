// Inference-engine benchmark (not a test): prefill and decode tokens/s of a
// model on given prompt ids, the machine's matrix-vector bandwidth, and the
// decode time that bandwidth allows for the model's weight bytes. Prints one
// JSON object; bench/engine/run_bench.py runs it beside transformers and
// writes the comparison.
//
//   bench_engine --model M.gguf --ids ids.json --lengths 512,2048 --decode 64 --threads 2
#include <sys/resource.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "capture/generate/dense_kv_cache.h"
#include "capture/generate/engine.h"
#include "capture/generate/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is KiB on Linux
}

// Bytes per second of y = W x (GEMV, what decode is made of) for a weight
// matrix far larger than the caches; best of several runs.
double gemv_bandwidth(int64_t rows, int64_t cols, torch::ScalarType dtype) {
  torch::Tensor w = torch::randn({rows, cols}).to(dtype);
  torch::Tensor x = torch::randn({cols}).to(dtype);
  torch::Tensor y = torch::empty({rows}, dtype);
  for (int i = 0; i < 3; ++i) torch::mv_out(y, w, x);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t = Clock::now();
    for (int i = 0; i < 10; ++i) torch::mv_out(y, w, x);
    best = std::min(best, since(t) / 10);
  }
  return static_cast<double>(w.nbytes()) / best;
}

// Seconds of one pass of matrix-vector products over the model's own weight
// matrices, in the order a decode step reads them (each layer's qkv, output,
// up and down projections, then the output head), best of five passes: a
// decode step that did nothing but stream its weights. Unlike one large
// matrix multiplied again and again (gemv_bandwidth), which a CPU with a
// last-level cache larger than the matrix serves from that cache (this Intel
// machine reports 480 MB of L3), the model's 513 MB do not come back before
// they are evicted.
double model_gemv_seconds(const kvscope::model::Transformer& m) {
  std::vector<torch::Tensor> mats;
  for (const auto& l : m.weights().layers)
    for (const torch::Tensor* t : {&l.wqkv, &l.wo, &l.w_up, &l.w_down})
      if (t->defined()) mats.push_back(*t);
  mats.push_back(m.weights().lm_head);
  std::vector<torch::Tensor> xs, ys;
  for (const torch::Tensor& w : mats) {
    xs.push_back(torch::randn({w.size(1)}).to(w.scalar_type()));
    ys.push_back(torch::empty({w.size(0)}, w.options()));
  }
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t = Clock::now();
    for (size_t i = 0; i < mats.size(); ++i) {
      if (mats[i].scalar_type() == torch::kFloat32)
        torch::mv_out(ys[i], mats[i], xs[i]);
      else  // as the engine's linear(): reduced-precision mv accumulates in that type
        ys[i] = torch::mm(xs[i].unsqueeze(0), mats[i].t());
    }
    if (rep > 0) best = std::min(best, since(t));  // the first pass warms up
  }
  return best;
}

// "BLAS_INFO=..." of LibTorch's build configuration (openblas, mkl, ...).
std::string blas_info() {
  const std::string config = torch::show_config();
  const auto at = config.find("BLAS_INFO=");
  if (at == std::string::npos) return "unknown BLAS";
  return config.substr(at + 10, config.find_first_of(", \n", at + 10) - at - 10);
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, ids_path, lengths = "512,2048", dtype = "fp32", kv_dtype;
  int threads = 2;
  int64_t decode = 64, chunk = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model")
      model = v;
    else if (a == "--ids")
      ids_path = v;
    else if (a == "--lengths")
      lengths = v;
    else if (a == "--decode")
      decode = std::stoll(v);
    else if (a == "--threads")
      threads = std::stoi(v);
    else if (a == "--chunk")
      chunk = std::stoll(v);
    else if (a == "--dtype")
      dtype = v;
    else if (a == "--kv-dtype")
      kv_dtype = v;
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  if (model.empty() || ids_path.empty()) {
    std::cerr << "usage: bench_engine --model M --ids ids.json [--lengths 512,2048] [--decode 64] "
                 "[--threads 2] [--chunk 512 (0: whole prompt)] [--dtype fp32|bf16] "
                 "[--kv-dtype fp32|bf16|fp16 (default: --dtype)]\n";
    return 2;
  }
  torch::NoGradGuard no_grad;
  kvscope::generate::ModelOptions mo;
  mo.model = model;
  mo.threads = threads;
  mo.dtype = dtype;
  mo.kv_dtype = kv_dtype;
  const auto load_start = Clock::now();
  kvscope::generate::Engine engine = kvscope::generate::open_engine(mo);
  const double load_s = since(load_start);
  kvscope::model::Transformer& m = *engine.model;
  std::ifstream in(ids_path);
  const std::vector<int64_t> all_ids = nlohmann::json::parse(in).get<std::vector<int64_t>>();

  nlohmann::json out;
  out["engine"] = "kvscope";
  out["model"] = model;
  out["threads"] = threads;
  out["dtype"] = dtype;
  out["kv_dtype"] = kvscope::generate::dtype_name(engine.kv_dtype);
  out["libtorch"] = TORCH_VERSION;
  out["blas"] = blas_info();
  out["prefill_chunk"] = chunk;
  out["load_seconds"] = load_s;
  out["weight_bytes"] = m.weight_bytes();
  out["parameters"] = m.parameter_count();
  const double bw = gemv_bandwidth(8192, 4096, m.dtype());
  out["gemv_bytes_per_second"] = bw;
  out["decode_floor_seconds"] = static_cast<double>(m.weight_bytes()) / bw;
  out["model_gemv_seconds"] = model_gemv_seconds(m);
  kvscope::generate::Sampler greedy(kvscope::generate::SamplingOptions{});

  for (int64_t n : parse_list(lengths)) {
    if (n > static_cast<int64_t>(all_ids.size())) {
      std::cerr << "ids file holds " << all_ids.size() << " ids, fewer than " << n << "\n";
      return 2;
    }
    torch::Tensor ids = torch::tensor(std::vector<int64_t>(all_ids.begin(), all_ids.begin() + n));
    kvscope::generate::DenseKvCache cache(m.config(), n + decode, torch::kCPU, engine.kv_dtype);
    // Warm-up on a short prefix (first-touch of weights and buffers).
    {
      kvscope::generate::DenseKvCache warm(m.config(), 64, torch::kCPU, engine.kv_dtype);
      m.forward(ids.narrow(0, 0, 32), 0, warm);
      for (int64_t p = 32; p < 40; ++p) m.forward(ids.narrow(0, p, 1), p, warm);
    }
    // Twice, the faster counts (as the transformers side): the first prefill
    // of a new length pays one-time costs (allocator growth, first touch).
    torch::Tensor logits;
    double prefill_s = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      cache.reset();
      auto t = Clock::now();
      m.announce_sequence_length(n);
      // --chunk 0: the whole prompt in one forward (as transformers does).
      const int64_t step = chunk > 0 ? chunk : n;
      for (int64_t p = 0; p < n; p += step)
        logits = m.forward(ids.narrow(0, p, std::min(step, n - p)), p, cache);
      prefill_s = std::min(prefill_s, since(t));
    }
    auto t = Clock::now();
    int32_t token = greedy.next(logits[0]);
    torch::Tensor next = torch::empty({1}, torch::kInt64);
    std::vector<double> steps;
    for (int64_t s = 0; s < decode; ++s) {
      t = Clock::now();
      next.data_ptr<int64_t>()[0] = token;
      logits = m.forward(next, n + s, cache);
      token = greedy.next(logits[0]);
      steps.push_back(since(t));
    }
    double decode_s = 0;
    for (double s : steps) decode_s += s;
    nlohmann::json r;
    r["prompt_tokens"] = n;
    r["kv_bytes"] = cache.bytes();  // n + decode positions at the stored width
    r["prefill_seconds"] = prefill_s;
    r["prefill_tokens_per_second"] = static_cast<double>(n) / prefill_s;
    r["decode_steps"] = decode;
    r["decode_seconds"] = decode_s;
    r["decode_tokens_per_second"] = static_cast<double>(decode) / decode_s;
    out["runs"].push_back(r);
  }
  out["peak_rss_mib"] = peak_rss_mib();
  std::cout << out.dump(2) << "\n";
  return 0;
}
