// Full validation of a trace against the v1 schema: every dataset's
// presence, element type, shape, chunking and attributes, then the values
// (ranges, cross-references, consistency of steps, events and occupancy),
// read in bounded blocks so a 1 GB trace is checked in constant memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::trace {

struct Violation {
  std::string field;    // dataset or attribute path, e.g. "/events/layer"
  std::string message;  // what is wrong and what was expected
};

struct ValidationReport {
  bool opened = false;    // the file opened as a KVScope trace
  bool complete = false;  // /run/complete == 1
  int64_t n_steps = 0;
  int64_t n_tokens = 0;
  int64_t n_events = 0;
  std::vector<Violation> violations;
  bool ok() const { return opened && violations.empty(); }
};

ValidationReport validate_trace(const std::string& path);
// The same for a file image in memory (`name` in messages; the fuzz target).
ValidationReport validate_trace_image(const std::string& name, const void* data, size_t size);

}  // namespace kvscope::trace
