// gui_live_writer TRACE FIRST TOTAL GO_FILE
// Writes a synthetic trace step by step like a running capture: FIRST steps,
// flushed, then TRACE.ready is created; once GO_FILE exists, the remaining
// steps up to TOTAL follow, each flushed, and the trace is closed. Lets the
// GUI's live-follow test run against a real SWMR writer in another process
// without timing assumptions.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/trace/synthetic.h"
#include "core/trace/writer.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: gui_live_writer TRACE FIRST TOTAL GO_FILE\n");
    return 2;
  }
  std::string path = argv[1], go = argv[4];
  long first = std::atol(argv[2]);
  kvscope::trace::SyntheticSpec spec;
  spec.decode_steps = std::atol(argv[3]) - 1;  // one prefill step + decode steps
  kvscope::trace::SyntheticCapture capture(spec);
  kvscope::trace::TraceWriter::Options options;
  options.flush_every_steps = 1;
  auto writer = kvscope::trace::TraceWriter::create(path, capture.run(), capture.layout(), options);
  for (long s = 0; s < capture.n_steps(); ++s) {
    if (s == first) {
      writer->flush();
      std::ofstream(path + ".ready") << first << "\n";
      while (access(go.c_str(), F_OK) != 0) usleep(20000);  // wait for the test's signal
    }
    writer->append_step(capture.step(s));
    writer->flush();
  }
  writer->close(kvscope::trace::GenerationSummary{});
  return 0;
}
