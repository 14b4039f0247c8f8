// Which nvcc built the CUDA kernels (kvscope info, kernels/cuda_available.h).
#include "kernels/cuda/kernels_cuda.h"

namespace kvscope::kernels::cuda {

const char* build_info() {
#define KVSCOPE_STR2(x) #x
#define KVSCOPE_STR(x) KVSCOPE_STR2(x)
  return "compiled with nvcc " KVSCOPE_STR(__CUDACC_VER_MAJOR__) "." KVSCOPE_STR(
      __CUDACC_VER_MINOR__);
}

}  // namespace kvscope::kernels::cuda
