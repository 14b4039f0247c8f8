# Learned gates (seeds 000-004): what a capture reads of them, the gate files
# and official checkpoints and the gate networks. Training is capture/train/,
# which includes these; nothing here includes capture/train/ or
# capture/policy/ (cmake/KVScopeLayering.cmake checks it).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # SHA-256 of models and data
target_link_libraries(kvscope_capture PRIVATE OpenSSL::Crypto)
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/torch_pickle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_set.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_kinds.cpp
  ${CMAKE_CURRENT_LIST_DIR}/official_checkpoints.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_nets.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_scorer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kvpop_math.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sfc_forecaster.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fastkvzip_gate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/restorekv_model.cpp
)
