target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/capture_levels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/recorder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/oracle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capture_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/replay.cpp
  ${CMAKE_CURRENT_LIST_DIR}/causal_run.cpp
)
