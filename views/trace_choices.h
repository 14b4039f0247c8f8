// What views' options name in a trace: a series of /series or a gate of
// /gates, by name or index, checked against the trace (InputError naming the
// option and listing what the trace has).
#pragma once

#include <string>

namespace kvscope::trace {
class TraceReader;
}

namespace kvscope::views {

// The index of `value` (a name or an index) in the trace's /series.
int series_index(const std::string& value, const trace::TraceReader& reader);

// The index of `value` in the trace's /gates; `time_varying`: the gate must
// have per-step samples.
int gate_index(const std::string& value, const trace::TraceReader& reader, bool time_varying);

}  // namespace kvscope::views
