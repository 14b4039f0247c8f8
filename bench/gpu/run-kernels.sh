#!/usr/bin/env bash
# On a GPU machine: builds the CUDA kernels, their parity test
# (tests/kernels/cuda_parity.cpp) and the kernel benchmark with nvcc, g++ and
# pip's torch alone (no CMake project, HDF5 or Qt needed), runs the test, then
# the benchmark with PyTorch's SDPA as the anchor in the same run.
#   bench/gpu/run-kernels.sh OUT_DIR [contexts...]
# Writes OUT_DIR/env.txt (GPU, driver, nvcc, torch, CPU), parity.txt,
# bench.jsonl, sdpa.jsonl and log.txt. Without nvcc on the machine it links
# objects prebuilt elsewhere when build-gpu-prebuilt/ holds them
# (bench/gpu/prebuild.sh: CUDA 13, sm_90, static cudart).
set -uo pipefail
out=${1:?usage: run-kernels.sh OUT_DIR [contexts...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
log() { echo "[run-kernels $(date +%T)] $*" | tee -a "$out/log.txt" >&2; }

py=""
for cand in python3 python /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import torch' 2>/dev/null; then py=$(command -v "$cand"); break; fi
done
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1 || true)
{
  nvidia-smi
  echo "nvcc: ${nvcc:-none}"; [ -n "$nvcc" ] && "$nvcc" --version
  echo "python with torch: ${py:-none}"
  [ -n "$py" ] && "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  g++ --version | head -1
  lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-300
} >"$out/env.txt" 2>&1
log "environment in env.txt: nvcc=${nvcc:-none} python=${py:-none}"

b=$(mktemp -d /tmp/kvscope-gpu.XXXX)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.[:space:]')
cap=${cap:-90}
cu_objs=()
if [ -n "$nvcc" ]; then
  cuda_home=$(dirname "$(dirname "$nvcc")")
  for f in kernels/cuda/*.cu; do
    o="$b/$(basename "$f" .cu).o"
    "$nvcc" -O3 -std=c++17 -arch=sm_$cap -I. -c "$f" -o "$o" 2>>"$out/log.txt" &
    cu_objs+=("$o")
  done
  cudart=(-L"$cuda_home/lib64" -L"$cuda_home/lib" -lcudart -Wl,-rpath,"$cuda_home/lib64")
  cuda_inc=(-I"$cuda_home/include")
elif [ -d build-gpu-prebuilt ]; then
  log "no nvcc: linking the objects of build-gpu-prebuilt/ ($(cat build-gpu-prebuilt/info.txt))"
  cu_objs=(build-gpu-prebuilt/*.o)
  cudart=(build-gpu-prebuilt/libcudart_static.a -lrt)
  cuda_inc=(-Ibuild-gpu-prebuilt/include)
else
  log "no nvcc and no build-gpu-prebuilt/: nothing to build"; exit 2
fi

torch_flags=() torch_libs=()
if [ -n "$py" ]; then
  tdir=$("$py" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  abi=$("$py" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  torch_flags=(-I"$tdir/include" -I"$tdir/include/torch/csrc/api/include" -D_GLIBCXX_USE_CXX11_ABI=$abi)
  torch_libs=(-L"$tdir/lib" -ltorch_cpu -lc10 -Wl,-rpath,"$tdir/lib")
fi
cxx=(g++ -O2 -std=c++17 -fno-trapping-math -I. "${cuda_inc[@]}")
# The parity test's CPU twins (kernels/cpu) include LibTorch's headers
# (C++20 from torch 2.10 on).
if [ -n "$py" ]; then
  for f in kernels/cpu/attention_decode_cpu.cpp kernels/cpu/parallel_cpu.cpp \
           kernels/cpu/quant_int4_cpu.cpp tests/kernels/cuda_parity.cpp; do
    "${cxx[@]}" -std=c++20 "${torch_flags[@]}" -c "$f" -o "$b/$(basename "$f" .cpp).o" 2>>"$out/log.txt" &
  done
fi
"${cxx[@]}" -c bench/gpu/kernel_bench_cuda.cpp -o "$b/kernel_bench_cuda.o" 2>>"$out/log.txt" &
wait
log "compiled: $(ls "$b" | tr '\n' ' ')"

rc=0
if [ -n "$py" ]; then
  if g++ -o "$b/cuda_parity" "$b"/attention_decode_cpu.o "$b"/parallel_cpu.o "$b"/quant_int4_cpu.o \
       "$b"/cuda_parity.o "${cu_objs[@]}" "${torch_libs[@]}" "${cudart[@]}" -lpthread -ldl 2>>"$out/log.txt"; then
    timeout "${KVSCOPE_PARITY_TIMEOUT:-150}" "$b/cuda_parity" >"$out/parity.txt" 2>&1; rc=$?
    log "parity test exit $rc: $(tail -1 "$out/parity.txt")"
  else
    log "parity test did not link (log.txt)"; rc=1
  fi
else
  log "no torch: the parity test (its CPU twins need LibTorch) was not built"
fi

if g++ -o "$b/bench" "$b/kernel_bench_cuda.o" "${cu_objs[@]}" "${cudart[@]}" -lpthread -ldl 2>>"$out/log.txt"; then
  timeout "${KVSCOPE_BENCH_TIMEOUT:-200}" "$b/bench" "$@" >"$out/bench.jsonl" 2>>"$out/log.txt" || log "benchmark exit $?"
  log "benchmark: $(wc -l <"$out/bench.jsonl") lines"
else
  log "benchmark did not link (log.txt)"
fi
if [ -n "$py" ]; then
  timeout "${KVSCOPE_BENCH_TIMEOUT:-200}" "$py" bench/gpu/sdpa_anchor.py "$@" >"$out/sdpa.jsonl" 2>>"$out/log.txt" || log "sdpa anchor exit $?"
  log "sdpa anchor: $(wc -l <"$out/sdpa.jsonl") lines"
fi
exit $rc
