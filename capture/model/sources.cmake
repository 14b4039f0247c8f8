target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/model_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mapped_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_builder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/llama2c_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rope.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_writer.cpp
)
