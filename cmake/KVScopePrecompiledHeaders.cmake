# kvscope_reuse_torch_pch(target): a target that compiles against LibTorch
# (it links kvscope_torch, directly or through kvscope_capture) reads
# kvscope_capture's precompiled <torch/torch.h> instead of parsing LibTorch's
# headers in each of its files: a test or command file that includes them
# compiles in about half the time. Call after target_link_libraries.
#
# GCC only. ccache keys a file that uses a PCH on the PCH's bytes; GCC's do
# not depend on where the checkout is (a fresh clone elsewhere: 99 of 102
# compilations from the cache), clang's record the checkout's absolute paths
# (80 of 99 missed in a clone beside the tree that filled the cache). The
# sanitizer tree (clang) compiles these files without it and stays
# cacheable from any checkout.
function(kvscope_reuse_torch_pch target)
  if(NOT KVSCOPE_USE_PCH OR NOT TARGET kvscope_capture OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  _kvscope_collect_links(${target} links)
  if("kvscope_torch" IN_LIST links)
    target_precompile_headers(${target} REUSE_FROM kvscope_capture)
  endif()
endfunction()
