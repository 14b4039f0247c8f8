target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kv_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ragged_cache.cpp
)
