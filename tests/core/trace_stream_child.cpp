// A capture in its own process, for the SWMR-follow and SIGKILL tests:
//   trace_stream_child PATH FLUSH_EVERY (lockstep|free) [STOP_AFTER]
// writes the small synthetic trace, prints "flushed N" after every flush and,
// in lockstep mode, waits for a line on stdin before it goes on. Prints
// "closed" after a clean close.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/trace/synthetic.h"
#include "tests/core/trace_test_util.h"

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  std::string path = argv[1];
  int64_t flush_every = std::atoll(argv[2]);
  bool lockstep = std::string(argv[3]) == "lockstep";
  kvscope::trace::SyntheticSpec spec = kvscope::test::small_spec(2, 5);
  spec.decode_steps = argc > 4 ? std::atoll(argv[4]) : 200;
  kvscope::trace::TraceWriter::Options options;
  options.flush_every_steps = flush_every;
  options.flush_every_seconds = 1e9;  // flush by step count only: the tests count on it
  options.on_flush = [&](int64_t steps) {
    std::cout << "flushed " << steps << std::endl;
    if (lockstep) {
      std::string line;
      if (!std::getline(std::cin, line)) std::exit(3);
    }
  };
  kvscope::trace::write_synthetic_trace(path, spec, options);
  std::cout << "closed" << std::endl;
  return 0;
}
