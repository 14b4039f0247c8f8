target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/params.cpp
  ${CMAKE_CURRENT_LIST_DIR}/budget.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decisions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_driver.cpp
  ${CMAKE_CURRENT_LIST_DIR}/builtin.cpp
  ${CMAKE_CURRENT_LIST_DIR}/composed.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gate_search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/wrappers.cpp
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
  ${CMAKE_CURRENT_LIST_DIR}/policies/wgkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/attention_gate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/trimkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/dbtrimkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/kvpop.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/sfc.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/scripted.cpp
  ${CMAKE_CURRENT_LIST_DIR}/held_rows.cpp
  ${CMAKE_CURRENT_LIST_DIR}/merge_values.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/random.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/observed_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/keydiff.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/lagkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/cur.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/leverage.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/non_causal_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/compactor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/criticalkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/simlayerkv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/qfilter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policies/critical_adakv.cpp
)
# Learned policies given no gates= look here for the gate shipped for the model.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gate_search.cpp PROPERTIES
  COMPILE_DEFINITIONS KVSCOPE_SHIPPED_GATES_DIR="${KVSCOPE_SOURCE_ROOT}/resources/gates")
