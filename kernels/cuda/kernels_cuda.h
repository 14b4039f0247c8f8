// CUDA twins of the CPU kernels, as raw-pointer launchers on device memory.
// They are compiled whenever nvcc is found; kernels/cuda_available.h says
// whether this build has them, and tests compare them with the CPU kernels
// where a GPU exists.
#pragma once

#include <cstdint>

namespace kvscope::kernels::cuda {

// Decode attention over one kv head's rows (see attention_decode_segments):
// segment tables as device arrays of row pointers (one per row) for K and V.
// Returns a cudaError_t as int.
int attention_decode_rows(const float* q, int64_t R, int64_t hd, const float* const* k_rows,
                          const float* const* v_rows, const int64_t* key_pos, int64_t rows,
                          int64_t q_pos, float scale, int64_t window, float* out, float* probs,
                          void* stream);

int quantize_int4(const float* x, int64_t rows, int64_t hd, uint8_t* codes, float* params,
                  void* stream);
int dequantize_int4(const uint8_t* codes, const float* params, int64_t rows, int64_t hd, float* x,
                    void* stream);

}  // namespace kvscope::kernels::cuda
