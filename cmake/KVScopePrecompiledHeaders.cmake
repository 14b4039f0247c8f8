# kvscope_reuse_torch_pch(target): a target that compiles against LibTorch
# (it links kvscope_torch, directly or through kvscope_capture) reads
# kvscope_capture's precompiled <torch/torch.h> instead of parsing LibTorch's
# headers in each of its files: a test or command file that includes them
# compiles in about a fifth of the time. Call after target_link_libraries.
function(kvscope_reuse_torch_pch target)
  if(NOT KVSCOPE_USE_PCH OR NOT TARGET kvscope_capture)
    return()
  endif()
  _kvscope_collect_links(${target} links)
  if("kvscope_torch" IN_LIST links)
    target_precompile_headers(${target} REUSE_FROM kvscope_capture)
  endif()
endfunction()
