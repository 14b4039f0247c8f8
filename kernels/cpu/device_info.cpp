#include "kernels/cuda_available.h"

namespace kvscope::kernels {

#ifdef KVSCOPE_HAVE_CUDA
const char* cuda_placeholder_info();  // kernels/cuda/placeholder.cu
bool cuda_compiled() { return true; }
const char* cuda_build_info() { return cuda_placeholder_info(); }
#else
bool cuda_compiled() { return false; }
const char* cuda_build_info() { return "not compiled (nvcc not found)"; }
#endif

}  // namespace kvscope::kernels
