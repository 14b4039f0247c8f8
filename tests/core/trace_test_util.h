// Helpers shared by the trace tests.
#pragma once

#include <string>

#include "core/trace/synthetic.h"

namespace kvscope::test {

// A small synthetic spec exercising every group (tiers as given).
trace::SyntheticSpec small_spec(int64_t tiers = 1, int64_t prefill_chunk = 0);
// Writes small_spec(...) to dir/name and returns the path.
std::string write_small_trace(const std::string& dir, const std::string& name, int64_t tiers = 1,
                              int64_t prefill_chunk = 0);
// Copies a file.
void copy_file(const std::string& from, const std::string& to);

}  // namespace kvscope::test
