// Where tests find their inputs and put their outputs.
#pragma once

#include <string>

namespace kvscope::test {

// The project checkout (env KVSCOPE_SOURCE_DIR, else the configure-time path).
std::string source_dir();
// The build directory (env KVSCOPE_BINARY_DIR, else the configure-time path).
std::string binary_dir();
// ../shared beside the checkout (env KVSCOPE_SHARED_DIR overrides).
std::string shared_dir();
// A fresh empty directory for this test; removed at exit unless
// KVSCOPE_KEEP_TEST_FILES is set.
std::string temp_dir();
// The kvscope executable of this build.
std::string kvscope_exe();
// Runs a shell command, returns its exit code and captures stdout+stderr.
int run_command(const std::string& command, std::string* output);

}  // namespace kvscope::test
