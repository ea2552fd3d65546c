#!/usr/bin/env bash
# Compile every shared/kernels/cuda/*.cu to a fat binary beside the installed package.
#
#   docker/build-cuda-kernels.sh "87" [SRC_DIR] [OUT_DIR]    Jetson Orin (sm_87)
#   docker/build-cuda-kernels.sh "75;80;86;89;90"            x86 datacenter/desktop GPUs
#
# Each fat binary holds SASS for every listed arch plus PTX for the last one, so a newer
# GPU still JIT-compiles the kernels. Used by the builder stages of docker/*/Dockerfile*;
# shared/kernels/cuda_backend.py loads them (cuModuleLoad) where fatbins.json, written
# last, says they fit the GPU, and compiles the sources only where they do not. The nvcc
# options are the kernels' own (cuda_backend.NVCC_OPTIONS: a unit test compares them).
set -euo pipefail
archs="${1:?usage: build-cuda-kernels.sh ARCHS [SRC_DIR]}"
src="${2:-shared/kernels/cuda}"
site="${3:-$(python -c 'import os, edgefleet.shared.kernels as k; print(os.path.dirname(k.__file__))')/cuda}"
mkdir -p "${site}"
options=(--fmad=false -std=c++14)
gencode=()
for a in ${archs//;/ }; do
  gencode+=(-gencode "arch=compute_${a},code=sm_${a}")
done
last="${archs##*;}"
gencode+=(-gencode "arch=compute_${last},code=compute_${last}")
shopt -s nullglob
count=0
for cu in "${src}"/*.cu; do
  out="${site}/$(basename "${cu%.cu}").fatbin"
  nvcc -O3 "${options[@]}" -fatbin "${gencode[@]}" -o "${out}" "${cu}"
  echo "built ${out}"
  count=$((count + 1))
done
sass=$(printf '%s,' ${archs//;/ })
opts=$(printf '"%s",' "${options[@]}")
printf '{"sass": [%s], "ptx": %s, "options": [%s]}\n' "${sass%,}" "${last}" "${opts%,}" \
  > "${site}/fatbins.json"
echo "${count} CUDA kernel file(s) compiled for sm_${archs//;/, sm_}"
