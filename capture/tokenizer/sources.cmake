# capture/tokenizer: tokenizer.json (HF BPE pipeline), GGUF vocabularies,
# llama2.c tokenizer.bin. Regexes via PCRE2, Unicode normalization and
# character classes via ICU (both linked privately by kvscope_capture).
target_sources(kvscope_capture PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/unicode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/regex.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pattern.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/normalizers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pre_tokenizers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decoders.cpp
  ${CMAKE_CURRENT_LIST_DIR}/post_processor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/added_tokens.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/spm_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/llama2c_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/load_tokenizer_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/load_gguf.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
)
target_link_libraries(kvscope_capture PRIVATE ICU::uc)
