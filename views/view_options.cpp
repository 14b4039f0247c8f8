#include "views/view_options.h"

#include <cstdio>
#include <cstdlib>

#include "core/common/check.h"

namespace kvscope::views {

std::string view_option_flag(const std::string& name) {
  std::string flag = "--" + name;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::string option_text(const ViewOptions& options, const std::string& name,
                        const std::string& fallback) {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

int64_t option_int(const ViewOptions& options, const std::string& name, int64_t fallback) {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  KVSCOPE_CHECK(end && *end == '\0' && !it->second.empty(),
                "view option " + name + " is '" + it->second + "', not an integer");
  return v;
}

double option_double(const ViewOptions& options, const std::string& name, double fallback) {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  KVSCOPE_CHECK(end && *end == '\0' && !it->second.empty(),
                "view option " + name + " is '" + it->second + "', not a number");
  return v;
}

bool option_set(const ViewOptions& options, const std::string& name) {
  return option_text(options, name) == "true";
}

std::string option_number(double value) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", value);
  return b;
}

}  // namespace kvscope::views
