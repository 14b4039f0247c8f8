#!/usr/bin/env bash
# Packs the capture engine's third-party headers, CMake configs and shared
# libraries from this (Debian 12) machine into one prefix, for
# bench/gpu/build-capture.sh on a GPU machine that has none of their -dev
# packages and cannot download them:
#   bench/gpu/make-sysroot.sh [SYSROOT_DIR (default /tmp/sysroot)] [TARBALL (default .gpu/sysroot.tar.xz)]
# Layout: include/ (nlohmann, CLI, toml, HDF5 serial, pcre2, unicode, openssl),
# share/cmake/ (nlohmann_json, CLI11, toml11 configs; they compute their prefix
# from their own location), lib/ (libhdf5_serial, libpcre2-8, libicuuc,
# libicudata, libcrypto and the ldd closure of them, each stored under its
# soname, plus the unversioned names the linker and CMake's find modules look
# for). glibc's libraries, libstdc++ and libgcc_s are left out: the target's
# are newer. Also copies the stories260K model into .gpu/models/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
s=${1:-/tmp/sysroot}
tarball=${2:-$root/.gpu/sysroot.tar.xz}
multi=/usr/lib/x86_64-linux-gnu

rm -rf "$s"
mkdir -p "$s/include" "$s/lib" "$s/share/cmake"

# Header-only libraries and their CMake package configs.
cp -a /usr/include/nlohmann /usr/include/CLI /usr/include/toml /usr/include/toml.hpp "$s/include/"
cp -a /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 /usr/share/cmake/toml11 "$s/share/cmake/"
# HDF5 (serial) headers go straight into include/: FindHDF5 with HDF5_ROOT
# set searches HDF5_ROOT/include only (NO_DEFAULT_PATH).
cp -a /usr/include/hdf5/serial/. "$s/include/"
cp -a /usr/include/pcre2.h "$s/include/"
cp -a /usr/include/unicode "$s/include/"
# OpenSSL: Debian splits the arch-specific configuration headers off.
cp -a /usr/include/openssl "$s/include/"
cp -a /usr/include/x86_64-linux-gnu/openssl/. "$s/include/openssl/"

# Shared libraries: the ones we link, then their ldd closure.
primary=(libhdf5_serial.so.103 libpcre2-8.so.0 libicuuc.so.72 libicudata.so.72 libcrypto.so.3 libssl.so.3)
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s)\.so'
declare -A seen=()
queue=()
for l in "${primary[@]}"; do queue+=("$multi/$l"); done
while ((${#queue[@]})); do
  path=${queue[0]}; queue=("${queue[@]:1}")
  name=$(basename "$path")
  [[ -n ${seen[$name]:-} ]] && continue
  seen[$name]=1
  cp -L "$path" "$s/lib/$name"
  while read -r dep _ dpath _; do
    [[ $dep =~ $skip ]] && continue
    [[ $dpath == /* ]] || { echo "make-sysroot: $name needs $dep, not found here" >&2; exit 1; }
    queue+=("$dpath")
  done < <(ldd "$path" | grep '=>')
done

# Unversioned names for linking: FindHDF5 looks for libhdf5.so.
cd "$s/lib"
ln -sf libhdf5_serial.so.103 libhdf5.so
ln -sf libhdf5_serial.so.103 libhdf5_serial.so
ln -sf libpcre2-8.so.0 libpcre2-8.so
ln -sf libicuuc.so.72 libicuuc.so
ln -sf libicudata.so.72 libicudata.so
ln -sf libcrypto.so.3 libcrypto.so
ln -sf libssl.so.3 libssl.so
chmod u+w,a+r "$s"/lib/*
{
  echo "built on: $(. /etc/os-release; echo "$PRETTY_NAME") $(date -u +%F)"
  for p in libhdf5-dev libpcre2-dev libicu-dev libssl-dev nlohmann-json3-dev libcli11-dev libtoml11-dev; do
    dpkg-query -W -f '${Package} ${Version}\n' "$p"
  done
} >"$s/VERSIONS"

mkdir -p "$(dirname "$tarball")"
tar -C "$s" -cf - . | xz -T2 -9e >"$tarball"
mkdir -p "$root/.gpu/models"
cp /work/shared/models/stories260K/stories260K.bin /work/shared/models/stories260K/tok512.bin "$root/.gpu/models/"
chmod u+w "$root"/.gpu/models/*
du -sh "$s" "$tarball" "$root/.gpu/models"
