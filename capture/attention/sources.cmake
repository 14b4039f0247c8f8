# The attention engine: the step driver (a step's named phases, the policy's
# hooks between them) and the paths a layer is attended by (host kernels,
# blocked matrix products, the CUDA kernels).
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/step_driver.cpp
  ${CMAKE_CURRENT_LIST_DIR}/blocked_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_attention.cpp
)
