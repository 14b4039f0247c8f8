target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dense_kv_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/failure_text.cpp
)
