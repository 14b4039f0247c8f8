#include "kernels/cuda_available.h"

namespace kvscope::capture {

const char* kernels_info() { return kvscope::kernels::cuda_build_info(); }

}  // namespace kvscope::capture
