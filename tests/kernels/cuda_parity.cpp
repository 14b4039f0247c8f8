// CUDA twins against the CPU kernels on the same random inputs. Exits 77
// (reported by CTest as skipped) when this machine has no GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant_int4.h"

namespace {

template <typename T>
T* to_device(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(&d, host.size() * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the CUDA twins compiled but cannot run here\n");
    return 77;
  }
  using namespace kvscope::kernels;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const int64_t R = 3, hd = 64, rows = 200, q_pos = 250;
  std::vector<float> q(static_cast<size_t>(R * hd)), k(size_t(rows * hd)), v(static_cast<size_t>(rows * hd));
  for (auto* vec : {&q, &k, &v})
    for (float& x : *vec) x = normal(rng);
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = i;
  std::vector<float> out_cpu(static_cast<size_t>(R * hd)), probs_cpu(static_cast<size_t>(R * rows));
  attention_decode_segments(q.data(), R, hd, {{k.data(), v.data(), rows, hd}}, pos.data(), q_pos,
                            0.125, 0, out_cpu.data(), probs_cpu.data());

  float *dq = to_device(q), *dk = to_device(k), *dv = to_device(v);
  std::vector<const float*> krows, vrows;
  for (int64_t i = 0; i < rows; ++i) {
    krows.push_back(dk + i * hd);
    vrows.push_back(dv + i * hd);
  }
  const float** dkr = to_device(krows);
  const float** dvr = to_device(vrows);
  int64_t* dpos = to_device(pos);
  float *dout = nullptr, *dprobs = nullptr;
  cudaMalloc(&dout, out_cpu.size() * 4);
  cudaMalloc(&dprobs, probs_cpu.size() * 4);
  cuda::attention_decode_rows(dq, R, hd, dkr, dvr, dpos, rows, q_pos, 0.125f, 0, dout, dprobs, nullptr);
  std::vector<float> out_gpu(out_cpu.size());
  cudaMemcpy(out_gpu.data(), dout, out_gpu.size() * 4, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (size_t i = 0; i < out_gpu.size(); ++i) worst = std::max(worst, double(std::fabs(out_gpu[i] - out_cpu[i])));

  std::vector<uint8_t> codes_cpu(static_cast<size_t>(rows * int4_code_bytes(hd))), codes_gpu(codes_cpu.size());
  std::vector<float> params_cpu(static_cast<size_t>(rows * int4_groups(hd) * 2));
  quantize_int4(k.data(), rows, hd, codes_cpu.data(), params_cpu.data());
  uint8_t* dcodes = nullptr;
  float* dparams = nullptr;
  cudaMalloc(&dcodes, codes_gpu.size());
  cudaMalloc(&dparams, params_cpu.size() * 4);
  cuda::quantize_int4(dk, rows, hd, dcodes, dparams, nullptr);
  cudaMemcpy(codes_gpu.data(), dcodes, codes_gpu.size(), cudaMemcpyDeviceToHost);
  size_t code_mismatch = 0;
  for (size_t i = 0; i < codes_gpu.size(); ++i) code_mismatch += codes_gpu[i] != codes_cpu[i];
  std::printf("decode attention max |gpu - cpu| = %g; INT4 codes differing: %zu of %zu\n", worst,
              code_mismatch, codes_gpu.size());
  return worst < 1e-4 && code_mismatch == 0 ? 0 : 1;
}
