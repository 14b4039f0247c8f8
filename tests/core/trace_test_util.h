// Helpers shared by the trace tests.
#pragma once

#include <string>

#include "core/trace/synthetic.h"
#include "core/trace/writer.h"

namespace kvscope::test {

// A small synthetic spec exercising every group (tiers as given).
trace::SyntheticSpec small_spec(int64_t tiers = 1, int64_t prefill_chunk = 0);
// Writes small_spec(...) to dir/name and returns the path.
std::string write_small_trace(const std::string& dir, const std::string& name, int64_t tiers = 1,
                              int64_t prefill_chunk = 0);
// The run of a hand-built trace: a "tiny" Llama of `layers` x `kv_heads`
// (4 heads, head dim 8, vocab 100), policy "test", capture level events.
trace::RunInfo tiny_run(int64_t layers, int64_t kv_heads);
// Copies a file.
void copy_file(const std::string& from, const std::string& to);

}  // namespace kvscope::test
