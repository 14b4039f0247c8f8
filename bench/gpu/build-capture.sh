#!/usr/bin/env bash
# On a GPU machine without the -dev packages (and no network): configures and
# builds the capture engine and the kvscope CLI (no GUI, tests or bench) with
# nvcc, pip's torch and the prefix bench/gpu/make-sysroot.sh packed into
# .gpu/sysroot.tar.xz (HDF5, PCRE2, ICU, OpenSSL, nlohmann_json, CLI11, toml11).
#   bash bench/gpu/build-capture.sh BUILD_DIR [extra cmake args...]
# Then run BUILD_DIR/app/kvscope with the LD_LIBRARY_PATH it prints (also in
# BUILD_DIR/kvscope-env.sh: `source BUILD_DIR/kvscope-env.sh`).
# Environment: KVSCOPE_SYSROOT (unpack there; /tmp/kvscope-sysroot),
# KVSCOPE_PYTHON (a python with torch), KVSCOPE_JOBS (16),
# KVSCOPE_CONFIGURE_ONLY=1 (stop after cmake).
set -uo pipefail
die() { printf 'build-capture: ERROR: %b\n' "$*" >&2; exit 1; }
log() { echo "[build-capture $(date +%T)] $*" >&2; }

[ $# -ge 1 ] || die "usage: bash bench/gpu/build-capture.sh BUILD_DIR [extra cmake args...]"
build=$1; shift
root=$(cd "$(dirname "$0")/../.." && pwd) || die "cannot find the repository root"
tarball=$root/.gpu/sysroot.tar.xz
sysroot=${KVSCOPE_SYSROOT:-/tmp/kvscope-sysroot}
jobs=${KVSCOPE_JOBS:-16}
mkdir -p "$build" || die "cannot create $build"
build=$(cd "$build" && pwd)

# 1. The sysroot: unpacked once per tarball (unchanged headers keep their
#    mtimes, so a second run rebuilds nothing).
[ -f "$tarball" ] || die "$tarball is missing (bench/gpu/make-sysroot.sh makes it; carry .gpu)"
stamp="$(stat -c '%s %Y' "$tarball")"
if [ "$(cat "$sysroot/.unpacked" 2>/dev/null)" != "$stamp" ]; then
  log "unpacking $tarball -> $sysroot"
  rm -rf "$sysroot" && mkdir -p "$sysroot" || die "cannot create $sysroot"
  if command -v xz >/dev/null; then
    tar -C "$sysroot" -xJf "$tarball" || die "cannot unpack $tarball"
  else  # no xz(1): Python's lzma
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$tarball" "$sysroot" || die "cannot unpack $tarball (no xz, and python3's tarfile failed)"
  fi
  # Libraries that only the packed ones need (curl, krb5, gnutls, zlib...):
  # where this machine has the same soname, its own (newer) copy serves
  # instead. HDF5, ICU and PCRE2 stay the packed ones: their headers are.
  if command -v ldconfig >/dev/null || [ -x /sbin/ldconfig ]; then
    cache=$( (command -v ldconfig >/dev/null && ldconfig -p || /sbin/ldconfig -p) 2>/dev/null)
    for f in "$sysroot"/lib/*.so.*; do
      so=$(basename "$f")
      case $so in libhdf5*|libicu*|libpcre2*|libsz*|libaec*) continue ;; esac
      sys=$(awk -v so="$so" '$1 == so && /x86-64/ {print $NF; exit}' <<<"$cache")
      if [ -n "$sys" ] && [ -e "$sys" ]; then ln -sf "$sys" "$f"; fi
    done
  fi
  echo "$stamp" >"$sysroot/.unpacked"
fi
export LD_LIBRARY_PATH="$sysroot/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(for f in "$sysroot"/lib/*.so.*; do ldd "$f" 2>/dev/null | grep 'not found'; done | sort -u)
[ -z "$missing" ] || die "sysroot libraries miss dependencies here:\n$missing"

# 2. Python with torch, its CMake prefix, nvcc.
py=""
for cand in ${KVSCOPE_PYTHON:-} /opt/torch/.venv/bin/python3 python3 python; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import torch' >/dev/null 2>&1; then
    py=$(command -v "$cand"); break
  fi
done
[ -n "$py" ] || die "no python with torch (set KVSCOPE_PYTHON)"
torch_prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') \
  || die "$py: torch.utils.cmake_prefix_path failed"
[ -f "$torch_prefix/Torch/TorchConfig.cmake" ] || die "no TorchConfig.cmake under $torch_prefix"
torch_info=$("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
# cmake and ninja may be pip's, beside the python.
export PATH="$PATH:$(dirname "$py")"
command -v cmake >/dev/null || die "cmake not found (PATH or $(dirname "$py"))"
command -v ninja >/dev/null || die "ninja not found (PATH or $(dirname "$py"))"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || die "nvcc not found (PATH or /usr/local/cuda/bin)"
cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
export PATH="$cuda_home/bin:$PATH"
log "python: $py (torch $torch_info)"
log "nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')), cmake $(cmake --version | head -1 | awk '{print $3}'), ninja $(ninja --version)"

# 3. Configure: pip's torch first in CMAKE_PREFIX_PATH (KVSCOPE_TORCH=pip),
#    the sysroot for the config packages (nlohmann_json, CLI11, toml11) and
#    PCRE2; each find module also gets its own root hint.
log "configure: $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVSCOPE_BUILD_GUI=OFF -DKVSCOPE_BUILD_TESTS=OFF -DKVSCOPE_BUILD_BENCH=OFF \
  -DKVSCOPE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCUDAToolkit_ROOT="$cuda_home" \
  -DKVSCOPE_TORCH=pip -DCMAKE_PREFIX_PATH="$torch_prefix;$sysroot" \
  -DHDF5_ROOT="$sysroot" -DICU_ROOT="$sysroot" -DOPENSSL_ROOT_DIR="$sysroot" -DPCRE2_ROOT="$sysroot" \
  "$@" || die "cmake configure failed (see above; $build/CMakeFiles/CMakeError.log)"

cat >"$build/kvscope-env.sh" <<EOF
# source this before running $build/app/kvscope
export LD_LIBRARY_PATH="$sysroot/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
if [ "${KVSCOPE_CONFIGURE_ONLY:-0}" = 1 ]; then
  log "configured (KVSCOPE_CONFIGURE_ONLY=1: not building)"
  echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  exit 0
fi

# 4. Build the CLI only.
log "build: ninja -j$jobs kvscope"
cmake --build "$build" --target kvscope -j "$jobs" || die "build failed (see above)"
exe=$build/app/kvscope
[ -x "$exe" ] || die "build finished but $exe is missing"
missing=$(ldd "$exe" | grep 'not found')
[ -z "$missing" ] || die "$exe misses libraries:\n$missing"
"$exe" --help >/dev/null 2>&1 || die "$exe --help fails (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
log "built $exe"
echo "export LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
