#include "tests/support/paths.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace kvscope::test {

namespace {
std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    if (std::getenv("KVSCOPE_KEEP_TEST_FILES")) return;
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}
}  // namespace

std::string source_dir() { return env_or("KVSCOPE_SOURCE_DIR", KVSCOPE_DEFAULT_SOURCE_DIR); }
std::string binary_dir() { return env_or("KVSCOPE_BINARY_DIR", KVSCOPE_DEFAULT_BINARY_DIR); }

std::string shared_dir() {
  const char* v = std::getenv("KVSCOPE_SHARED_DIR");
  if (v && *v) return v;
  return (std::filesystem::path(source_dir()).parent_path() / "shared").string();
}

std::string temp_dir() {
  std::string templ = (std::filesystem::temp_directory_path() / "kvscope-test-XXXXXX").string();
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  temp_dirs().dirs.push_back(templ);
  return templ;
}

std::string kvscope_exe() { return binary_dir() + "/app/kvscope"; }

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return -1;
  char buf[4096];
  size_t n;
  if (output) output->clear();
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0)
    if (output) output->append(buf, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace kvscope::test
