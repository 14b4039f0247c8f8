target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mapped_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
)
