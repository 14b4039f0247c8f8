// A view's own options, by name, as text: its descriptor declares them (the
// `kvscope export --NAME` options and their choices), its widget holds them
// (its controls row sets them), its figure reads them. The GUI and the
// export build the same FigureRequest from them and call the same load.
#pragma once

#include <QString>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope::views {

using ViewOptions = std::map<std::string, std::string>;

struct ViewOption {
  std::string name;  // `--NAME` (underscores as dashes)
  std::string help;
  std::vector<std::string> choices = {};  // empty: any text
  bool flag = false;                      // a flag: "true" when given
  int64_t min = 0, max = 0;               // max > min: an integer in [min, max]
};

// The command-line spelling: "no_evicted" -> "--no-evicted".
std::string view_option_flag(const std::string& name);

// A value of `options`, or `fallback` when it is absent.
std::string option_text(const ViewOptions& options, const std::string& name,
                        const std::string& fallback = "");
int64_t option_int(const ViewOptions& options, const std::string& name, int64_t fallback);
double option_double(const ViewOptions& options, const std::string& name, double fallback);
bool option_set(const ViewOptions& options, const std::string& name);  // a flag given

// Exact text of a number for an options map (round-trips through option_double).
std::string option_number(double value);

}  // namespace kvscope::views
