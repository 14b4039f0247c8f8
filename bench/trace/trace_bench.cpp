// Trace I/O benchmark (not a test). Prints:
//  1. write throughput of an event-heavy capture (events/s, MB/s of event
//     columns, bytes per event on disk) against an anchor measured in the same
//     run: the same column bytes written raw with fwrite;
//  2. time to open a >= 1 GB trace and read one (layer, head) slice (its
//     lifetimes and its whole pooled map), against reading the same number of
//     bytes sequentially from a raw file.
// usage: bench_trace [WORK_DIR] [--big-tokens N] [--compression LEVEL]
#include <hdf5.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/trace/reader.h"
#include "core/trace/synthetic.h"
#include "core/trace/writer.h"

using namespace kvscope::trace;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Sum of the bytes HDF5 allocated to dataset chunks: what the file would be
// without free space left behind by rewritten chunks.
int64_t dataset_storage_bytes(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
  int64_t total = 0;
  H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE,
           [](hid_t obj, const char* name, const H5O_info_t* info, void* data) -> herr_t {
             if (info->type == H5O_TYPE_DATASET) {
               hid_t d = H5Dopen2(obj, name, H5P_DEFAULT);
               *static_cast<int64_t*>(data) += int64_t(H5Dget_storage_size(d));
               H5Dclose(d);
             }
             return 0;
           },
           &total);
  H5Fclose(f);
  return total;
}

constexpr int64_t kEventBytes = 4 + 2 + 2 + 4 + 1 + 4 + 2 + 1 + 1;  // one row of /events

// An H2O-like capture: every step every head admits the new token and evicts
// one old one, with scores.
void bench_write(const std::string& dir, int compression) {
  const int64_t L = 32, K = 8, H = 32, steps = 1500, prompt = 512;
  RunInfo run;
  run.model.name = "bench";
  run.model.architecture = "llama";
  run.model.n_layers = L;
  run.model.n_heads = H;
  run.model.n_kv_heads = K;
  run.model.head_dim = 64;
  run.model.vocab_size = 32000;
  run.model.context_length = 8192;
  run.policy = run.policy_name = "bench";
  run.reason_names = {"new", "lowest score"};
  CaptureLayout layout;
  layout.max_tokens = prompt + steps;
  std::string path = dir + "/write-bench.kvtrace.h5";
  TraceWriter::Options options;
  options.compression_level = compression;
  auto writer = TraceWriter::create(path, run, layout, options);
  std::vector<StepData> data;
  int64_t events = 0;
  // Build all steps first: the benchmark times the writer, not the generator.
  for (int64_t s = 0; s < steps; ++s) {
    StepData sd;
    int64_t first = s == 0 ? 0 : prompt + s - 1, n = s == 0 ? prompt : 1;
    sd.step = {s == 0 ? StepKind::Prefill : StepKind::Decode, int32_t(first), int32_t(n), 0, 0, 0, 0};
    for (int64_t t = first; t < first + n; ++t) sd.tokens.push_back({int32_t(t % 32000), int32_t(t), TokenRole::Prompt, int32_t(s), -1, " tok"});
    for (int64_t l = 0; l < L; ++l)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t t = first; t < first + n; ++t) {
          sd.events.push_back({int32_t(s), int16_t(l), int16_t(k), int32_t(t), EventKind::Admit, 0.5f, 0, kNoTier, 0});
          if (t >= 256) sd.events.push_back({int32_t(s), int16_t(l), int16_t(k), int32_t(t - 256 + (l + k) % 7), EventKind::Evict, float(t % 97) / 97.0f, 1, 0, kNoTier});
        }
    sd.occupancy.assign(size_t(L * K), 256);
    sd.step.entries = L * K * 256;
    events += int64_t(sd.events.size());
    data.push_back(std::move(sd));
  }
  // A capture evicts a token once: drop duplicate evictions the pattern made.
  std::vector<std::vector<char>> evicted(size_t(L * K), std::vector<char>(size_t(prompt + steps), 0));
  events = 0;
  for (auto& sd : data) {
    std::vector<Event> kept;
    for (const Event& e : sd.events) {
      if (e.kind == EventKind::Evict) {
        char& seen = evicted[size_t(e.layer * K + e.kv_head)][size_t(e.token)];
        if (seen) continue;
        seen = 1;
      }
      kept.push_back(e);
    }
    sd.events.swap(kept);
    events += int64_t(sd.events.size());
  }

  auto t0 = Clock::now();
  for (const StepData& sd : data) writer->append_step(sd);
  writer->close(GenerationSummary{});
  double t_write = seconds_since(t0);
  int64_t bytes = file_size(path);

  // Anchor: the same event columns written raw.
  std::string raw = dir + "/write-bench.raw";
  auto t1 = Clock::now();
  FILE* f = std::fopen(raw.c_str(), "wb");
  std::vector<uint8_t> row(kEventBytes);
  for (const StepData& sd : data)
    for (const Event& e : sd.events) {
      std::memcpy(row.data(), &e, std::min<size_t>(sizeof e, row.size()));
      std::fwrite(row.data(), 1, row.size(), f);
    }
  std::fflush(f);
  std::fclose(f);
  double t_raw = seconds_since(t1);

  double mb = double(events * kEventBytes) / 1e6;
  std::printf("write: deflate level %d: %lld events in %lld steps (L=%lld K=%lld), %.2f s\n", compression,
              (long long)events, (long long)steps, (long long)L, (long long)K, t_write);
  std::printf("write: %.2f M events/s, %.1f MB/s of event columns, file %.1f MB, %.2f bytes/event on disk (all groups)\n",
              double(events) / t_write / 1e6, mb / t_write, double(bytes) / 1e6, double(bytes) / double(events));
  std::printf("write: dataset storage %.1f MB of the %.1f MB file (the rest is metadata and space left by rewritten chunks)\n",
              double(dataset_storage_bytes(path)) / 1e6, double(bytes) / 1e6);
  std::printf("write: anchor raw fwrite of the same columns %.2f s (%.1f MB/s); trace writer = %.2fx the raw time\n",
              t_raw, mb / t_raw, t_write / t_raw);
}

void bench_open_big(const std::string& dir, int64_t tokens) {
  std::string path = dir + "/big.kvtrace.h5";
  SyntheticSpec spec;
  spec.layers = 32;
  spec.heads = 32;
  spec.kv_heads = 8;
  spec.prompt_tokens = tokens - 64;
  spec.decode_steps = 64;
  spec.prefill_chunk = 512;
  spec.window = 1024;
  spec.sinks = 4;
  spec.pooled_block = 16;
  spec.topk = 0;
  spec.received = false;
  spec.dense = false;
  spec.oracle = false;
  spec.gates = false;
  TraceWriter::Options opt;
  opt.compression_level = 1;
  auto t0 = Clock::now();
  write_synthetic_trace(path, spec, opt);
  double t_gen = seconds_since(t0);
  int64_t bytes = file_size(path);
  std::printf("big: %lld tokens, 32 layers x 32 heads (8 kv), pooled block 16: %.2f GB written in %.1f s (dataset storage %.2f GB)\n",
              (long long)tokens, double(bytes) / 1e9, t_gen, double(dataset_storage_bytes(path)) / 1e9);

  auto t1 = Clock::now();
  auto reader = TraceReader::open(path);
  double t_open = seconds_since(t1);
  auto t2 = Clock::now();
  HeadLifetimes life = reader->lifetimes(17, 5);
  int64_t kb = reader->pooled_key_blocks();
  PooledTile tile = reader->pooled(17, 21, 0, reader->pooled_query_blocks(), 0, kb);
  double t_slice = seconds_since(t2);
  int64_t slice_bytes = int64_t(life.admit_step.size() * 8 + tile.max.size() * 4);

  // Anchor: a sequential read of the same number of (uncompressed) bytes.
  std::string raw = dir + "/big.raw";
  {
    std::vector<char> buf(size_t(slice_bytes), 1);
    FILE* f = std::fopen(raw.c_str(), "wb");
    std::fwrite(buf.data(), 1, buf.size(), f);
    std::fclose(f);
  }
  auto t3 = Clock::now();
  {
    std::vector<char> buf(static_cast<size_t>(slice_bytes));
    FILE* f = std::fopen(raw.c_str(), "rb");
    size_t got = std::fread(buf.data(), 1, buf.size(), f);
    std::fclose(f);
    if (got != buf.size()) std::printf("short read\n");
  }
  double t_raw = seconds_since(t3);
  std::printf("big: open %.1f ms; read one (layer, head) slice (lifetimes of %zu tokens + %lldx%lld pooled max/mean) %.1f ms\n",
              t_open * 1e3, life.admit_step.size(), (long long)reader->pooled_query_blocks(), (long long)kb, t_slice * 1e3);
  std::printf("big: anchor sequential read of the same %.1f MB from page cache %.2f ms; slice = %.1fx the anchor\n",
              double(slice_bytes) / 1e6, t_raw * 1e3, t_slice / t_raw);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string() + "/kvscope-bench";
  int64_t big_tokens = 10752;  // 32 x 32 heads x 672^2 pooled blocks: a file over 1 GB
  int compression = TraceWriter::Options{}.compression_level;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--big-tokens") big_tokens = std::atoll(argv[i + 1]);
    if (std::string(argv[i]) == "--compression") compression = std::atoi(argv[i + 1]);
  }
  std::filesystem::create_directories(dir);
  bench_write(dir, compression);
  if (big_tokens > 0) bench_open_big(dir, big_tokens);
  return 0;
}
