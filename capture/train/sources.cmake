# Training (kvscope train): the trainers, their data, objectives,
# calibrations and profiles. It includes the gate networks (capture/gates)
# and the policies whose scores it fits to; nothing at capture time includes
# it (cmake/KVScopeLayering.cmake checks it).
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gated_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_outputs.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gated_trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gated_methods.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/query_calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvzap_calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvzip_targets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lukv_profiling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fastkvzip_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/restorekv_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/duo_attention_training.cpp
)
