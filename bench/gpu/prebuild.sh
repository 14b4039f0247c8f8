#!/usr/bin/env bash
# Prebuilds the CUDA kernels here (nvcc, sm_90 SASS + PTX, static cudart) into
# build-gpu-prebuilt/, for bench/gpu/run-kernels.sh on a GPU machine that has
# no nvcc. The objects need a driver that runs this CUDA's runtime.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
d=build-gpu-prebuilt
rm -rf "$d" && mkdir -p "$d/include"
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
for f in kernels/cuda/*.cu; do
  nvcc -O3 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -I. -c "$f" -o "$d/$(basename "$f" .cu).o"
done
cp "$cuda_home/lib64/libcudart_static.a" "$d/"
cp -r "$cuda_home/include/." "$d/include/"
rm -rf "$d/include/cccl"  # 17 MB the host code does not include
nvcc --version | tail -1 >"$d/info.txt"
du -sh "$d"
