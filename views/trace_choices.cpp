#include "views/trace_choices.h"

#include <vector>

#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::views {

namespace {

// A name or a small index into `names` (-1: neither).
int name_or_index(const std::string& value, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == value) return int(i);
  if (!value.empty() && value.find_first_not_of("0123456789") == std::string::npos &&
      value.size() < 9)
    return std::stoi(value);
  return -1;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

int series_index(const std::string& value, const trace::TraceReader& reader) {
  std::vector<std::string> names;
  for (const trace::SeriesSpec& s : reader.series()) names.push_back(s.name);
  const int index = name_or_index(value, names);
  if (index >= 0 && index < static_cast<int>(names.size())) return index;
  throw InputError(
      reader.path(), "--series",
      "'" + value + "' is not a series of the trace (its series: " + joined(names) + ")");
}

int gate_index(const std::string& value, const trace::TraceReader& reader, bool time_varying) {
  const std::vector<trace::GateSpec>& gates = reader.layout().gates;
  std::vector<std::string> names, varying;
  for (const trace::GateSpec& g : gates) {
    names.push_back(g.name);
    if (g.time_varying) varying.push_back(g.name);
  }
  const int index = name_or_index(value, names);
  const bool number = value.find_first_not_of("0123456789") == std::string::npos;
  if (index < 0 || index >= static_cast<int>(names.size())) {
    if (number)
      throw InputError(reader.path(), "--gate",
                       value + " is outside [0, " + std::to_string(names.size()) +
                           ") (the trace's gates: /gates)");
    throw InputError(
        reader.path(), "--gate",
        "'" + value + "' is not a gate of the trace (its gates: " + joined(names) + ")");
  }
  if (time_varying && !gates[size_t(index)].time_varying)
    throw InputError(
        reader.path(), "--gate",
        "'" + names[size_t(index)] +
            "' has no per-step samples (the trace's time-varying gates: " + joined(varying) + ")");
  return index;
}

}  // namespace kvscope::views
