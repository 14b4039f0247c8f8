// Checks shared by every command line (kvscope's subcommands, kvscope-gui):
// option validators for CLI11 (a failed check is a parse error: exit 2 with
// the option and the accepted range) and output-path checks made before any
// work starts, so a typo never costs a capture and never leaves a
// half-written file behind. Header-only: nothing in core links CLI11.
#pragma once

#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/common/input_error.h"

namespace kvscope {

// A number in [lo, hi]; NaN and infinities are refused (CLI::Range lets NaN
// through: every comparison with NaN is false).
inline CLI::Validator finite_range(double lo, double hi) {
  char desc[96];
  std::snprintf(desc, sizeof desc, "FLOAT in [%g, %g]", lo, hi);
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || !end || *end != '\0') return "'" + text + "' is not a number";
        if (!std::isfinite(v) || v < lo || v > hi) {
          char msg[128];
          std::snprintf(msg, sizeof msg, "%s is outside [%g, %g]", text.c_str(), lo, hi);
          return msg;
        }
        return {};
      },
      desc);
}

// An output file can be written where it is asked for: its folder exists and
// the path is not a folder. Throws InputError naming the option.
inline void check_output_path(const std::string& path, const char* option) {
  struct stat st {};
  if (path.empty()) throw InputError("", option, "an output path is required");
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InputError(path, option, "is a directory (expected a file path)");
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError(path, option, "the directory " + dir + " does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    throw InputError(path, option, "the directory " + dir + " is not writable");
}

}  // namespace kvscope
