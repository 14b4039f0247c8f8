target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/budget.cpp
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/full.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/window.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/streaming_llm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/h2o.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scorer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/tova.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/snapkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/pyramidkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/knorm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/expected_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/adakv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/duo_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/quest.cpp
)
