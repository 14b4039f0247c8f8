// Whether this build compiled the CUDA twins of the kernels.
#pragma once

namespace kvscope::kernels {

bool cuda_compiled();
// "compiled for sm_80 with nvcc 13.0" or "not compiled (nvcc not found)".
const char* cuda_build_info();

}  // namespace kvscope::kernels
