# ccache when present: a warm CI run recompiles nothing that did not change.
find_program(KVSCOPE_CCACHE ccache)
if(KVSCOPE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER ${KVSCOPE_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KVSCOPE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${KVSCOPE_CCACHE})
  message(STATUS "ccache: ${KVSCOPE_CCACHE}")
endif()
