// What a failed run says (capture/generate/failure_text.h): LibTorch's
// errors without their C++ backtrace, its allocators running out said with
// what is there, other exceptions as they are.
#include <c10/util/Exception.h>

#include <catch2/catch.hpp>
#include <new>
#include <stdexcept>

#include "capture/generate/failure_text.h"

using kvscope::generate::failure_text;

namespace {

// Throws what TORCH_CHECK throws and returns it caught.
template <typename Throw>
std::string text_of(Throw&& thrower) {
  try {
    thrower();
  } catch (const std::exception& e) {
    return failure_text(e);
  }
  FAIL("nothing was thrown");
  return "";
}

}  // namespace

TEST_CASE("failure text: a LibTorch error without its backtrace") {
  std::string full;
  try {
    TORCH_CHECK(false, "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
  } catch (const c10::Error& e) {
    full = e.what();
    CHECK(failure_text(e) == "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)");
  }
  // what() is what would have been printed before: the message and where
  // in LibTorch it was raised.
  CHECK(full.size() >
        std::string("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)").size());
}

TEST_CASE("failure text: running out of memory says so, with what is there") {
  const std::string host = text_of([] {
    TORCH_CHECK(false,
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 2147483648 bytes. Error code 12 (Cannot "
                "allocate memory)");
  });
  CHECK(host.rfind(
            "out of host memory: LibTorch could not allocate 2.0 GiB more; this machine has ", 0) ==
        0);
  const std::string device = text_of([] {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                     "of 79.10 GiB of which 1.12 GiB is free.");
  });
  CHECK(device.rfind("out of device memory: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                     "has a total capacity of 79.10 GiB of which 1.12 GiB is free. (a shorter",
                     0) == 0);
  const std::string bad_alloc = text_of([] { throw std::bad_alloc(); });
  CHECK(bad_alloc.rfind("out of host memory: an allocation failed; this machine has ", 0) == 0);
}

TEST_CASE("failure text: other exceptions as they are") {
  CHECK(text_of([] { throw std::runtime_error("disk full: /tmp/x.kvtrace.h5"); }) ==
        "disk full: /tmp/x.kvtrace.h5");
}
