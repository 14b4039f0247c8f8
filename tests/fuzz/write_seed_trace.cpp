// Writes the trace seeds no CLI command leaves behind (tests/fuzz/
// make_seeds.py runs it):
//   write_seed_trace PATH incomplete  4 of 9 steps, writer destroyed without
//                                     close(): /run/complete = 0
//   write_seed_trace PATH killed      the process exits right after the second
//                                     flush, as a killed capture does: the file
//                                     keeps its SWMR-write flags
// One layer and one kv head keep the file small.
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/trace/synthetic.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: write_seed_trace PATH incomplete|killed\n";
    return 2;
  }
  const std::string path = argv[1], mode = argv[2];
  kvscope::trace::SyntheticSpec spec;
  spec.layers = 1;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.prompt_tokens = 16;
  spec.prefill_chunk = 8;
  spec.decode_steps = 7;
  spec.sinks = 1;
  spec.window = 4;
  spec.tiers = 2;
  spec.pooled_block = 4;
  spec.topk = 2;
  kvscope::trace::TraceWriter::Options options;
  options.flush_every_steps = 2;
  options.flush_every_seconds = 1e9;
  if (mode == "incomplete") {
    kvscope::trace::write_synthetic_trace(path, spec, options, /*stop_after_steps=*/4);
    return 0;
  }
  if (mode != "killed") return 2;
  int flushes = 0;
  options.on_flush = [&](int64_t) {
    if (++flushes == 2) std::_Exit(0);  // no HDF5 close: as SIGKILL leaves it
  };
  kvscope::trace::write_synthetic_trace(path, spec, options);
  return 1;
}
