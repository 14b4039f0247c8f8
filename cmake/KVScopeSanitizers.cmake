# Sanitizer and fuzzing builds (./scripts/test --sanitize uses both, in
# build-sanitize/ with clang):
#   -DKVSCOPE_SANITIZE=address,undefined   every target of ours instrumented
#   -DKVSCOPE_FUZZ=ON                      libFuzzer targets in tests/fuzz (clang only)
# Third-party libraries (LibTorch, HDF5, Qt) stay uninstrumented; ASan still
# sees every allocation they make through malloc.
set(KVSCOPE_SANITIZE "" CACHE STRING "Sanitizers for our code, e.g. address,undefined")
option(KVSCOPE_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang)" OFF)

if(KVSCOPE_SANITIZE)
  add_compile_options(-fsanitize=${KVSCOPE_SANITIZE} -fno-omit-frame-pointer -g1)
  add_link_options(-fsanitize=${KVSCOPE_SANITIZE})
  if(KVSCOPE_SANITIZE MATCHES "undefined")
    # A report fails the test instead of scrolling past.
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  message(STATUS "sanitizers: ${KVSCOPE_SANITIZE}")
endif()

if(KVSCOPE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVSCOPE_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang (Debian packages clang, libclang-rt-dev)")
  endif()
  # Coverage feedback for every library the targets link; the targets
  # themselves add -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt).
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "fuzz targets: tests/fuzz")
endif()
