// KVSCOPE_HOST_DEVICE: marks the small inline rules that the CPU kernels and
// the CUDA kernels share (compiled for both under nvcc, plain C++ elsewhere).
#pragma once

#if defined(__CUDACC__)
#define KVSCOPE_HOST_DEVICE __host__ __device__
#else
#define KVSCOPE_HOST_DEVICE
#endif
