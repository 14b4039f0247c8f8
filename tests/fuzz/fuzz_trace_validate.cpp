// libFuzzer target: the trace validator (`kvscope info --check`,
// core/trace/validate.h) on any file, through the structure-aware HDF5
// mutator (trace_mutator.h). The validator must list violations, never
// crash, hang or allocate without bound; and a trace it calls valid must
// open in the reader (the two share open.cpp but check separately).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/trace/reader.h"
#include "core/trace/validate.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/trace_mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is opened where it lies, as a file image (no file per input).
  const char* name = "input.kvtrace.h5";
  // validate_trace reports bad input as violations; it throws nothing.
  const kvscope::trace::ValidationReport report =
      kvscope::trace::validate_trace_image(name, data, size);
  if (report.opened) kvscope::fuzz::note_trace_opened(data, size);
  if (report.ok()) {
    try {
      kvscope::trace::TraceReader::open_image(name, data, size);
    } catch (const kvscope::InputError& e) {
      std::fprintf(stderr, "the validator found no violation but the reader refused: %s\n",
                   e.what());
      std::abort();
    }
  }
  return 0;
}
