// Checks on validation reports shared by the trace tests.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "core/trace/validate.h"

namespace kvscope::test {

// Whether `r` holds the violation (field, message); logs every violation it
// holds, for the assertion that fails.
inline bool has_violation(const trace::ValidationReport& r, const std::string& field,
                          const std::string& message) {
  for (const trace::Violation& v : r.violations) {
    UNSCOPED_INFO(v.field << ": " << v.message);
    if (v.field == field && v.message == message) return true;
  }
  return false;
}

}  // namespace kvscope::test
