# Learned gates (seeds 000-004): gate files and official checkpoints, the gate
# networks, the differentiable gated attention and the trainer.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # SHA-256 of models and data
target_link_libraries(kvscope_capture PRIVATE OpenSSL::Crypto)
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/torch_pickle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_set.cpp
  ${CMAKE_CURRENT_LIST_DIR}/official_checkpoints.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_nets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_scorer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gated_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_math.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_forecaster.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/query_calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvzap_calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvzip_targets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lukv_profiling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fastkvzip_gate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fastkvzip_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/restorekv_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/restorekv_training.cpp
  ${CMAKE_CURRENT_LIST_DIR}/duo_attention_training.cpp
)
