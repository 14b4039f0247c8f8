#include "capture/generate/failure_text.h"

#include <c10/util/Exception.h>

#include <new>

#include "core/common/memory_limit.h"

namespace kvscope::generate {

std::string failure_text(const std::exception& e) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e))
    // LibTorch's CUDA message says what was asked and what the device holds.
    return std::string("out of device memory: ") + oom->what_without_backtrace() + " (" +
           kLessMemoryAdvice + ")";
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    const std::string what = error->what_without_backtrace();
    return explain_host_allocation_failure(what).value_or(what);
  }
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of host memory: an allocation failed; " + host_memory_situation();
  return e.what();
}

}  // namespace kvscope::generate
