target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/needle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/defer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/niah.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cwe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scorers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/haystack.cpp
  ${CMAKE_CURRENT_LIST_DIR}/task_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/task_prompt.cpp
)
