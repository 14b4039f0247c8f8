#include "kernels/cuda_available.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda/kernels_cuda.h"
#endif

namespace kvscope::kernels {

#ifdef KVSCOPE_HAVE_CUDA
bool cuda_compiled() {
  return true;
}
const char* cuda_build_info() {
  return cuda::build_info();
}
#else
bool cuda_compiled() {
  return false;
}
const char* cuda_build_info() {
  return "not compiled (nvcc not found)";
}
#endif

}  // namespace kvscope::kernels
