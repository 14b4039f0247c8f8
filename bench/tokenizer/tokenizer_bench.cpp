// Encode throughput: bench_tokenizer TOKENIZER TEXT_FILE [REPEATS] [CHUNK_BYTES]
// (TOKENIZER: anything Tokenizer::load reads; tokenizer.bin reads to the end)
// Encodes the file (whole, or in chunks of about CHUNK_BYTES split at line
// ends) REPEATS times after one warm-up pass, one thread, and prints one JSON
// line: bytes, tokens, best seconds, MB/s, tokens/s, and a checksum of the ids
// so run_bench.py can check they equal Hugging Face's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace {

std::vector<std::string> chunks_of(const std::string& text, size_t chunk) {
  if (chunk == 0) return {text};
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = std::min(text.size(), start + chunk);
    size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER TEXT_FILE [REPEATS] [CHUNK_BYTES]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  const size_t chunk = argc > 4 ? static_cast<size_t>(std::atol(argv[4])) : 0;
  std::ifstream in(argv[2], std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto pieces = chunks_of(text, chunk);

  auto t0 = std::chrono::steady_clock::now();
  auto tok = kvscope::tokenizer::Tokenizer::load(argv[1]);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t tokens = 0;
  uint64_t checksum = 0;
  double best = 1e30;
  for (int r = 0; r <= repeats; ++r) {  // r == 0 warms the word cache, as HF's
    size_t n = 0;
    uint64_t sum = 0;
    auto a = std::chrono::steady_clock::now();
    for (const auto& p : pieces) {
      auto ids = tok->encode(p, false);
      n += ids.size();
      for (int32_t id : ids) sum = sum * 1000003u + static_cast<uint32_t>(id);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    if (r > 0) best = std::min(best, s);
    tokens = n;
    checksum = sum;
  }
  std::printf(
      "{\"impl\": \"kvscope\", \"bytes\": %zu, \"chunks\": %zu, \"tokens\": %zu, \"load_s\": %.4f, "
      "\"best_s\": %.6f, \"mb_per_s\": %.3f, \"tokens_per_s\": %.0f, \"checksum\": %llu}\n",
      text.size(), pieces.size(), tokens, load_s, best, text.size() / best / 1e6, tokens / best,
      static_cast<unsigned long long>(checksum));
  return 0;
}
