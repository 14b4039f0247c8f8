target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/budget.cpp
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/full.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/window.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/streaming_llm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/h2o.cpp
)
