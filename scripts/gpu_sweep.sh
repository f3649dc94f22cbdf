#!/usr/bin/env bash
# Times alternatives to the CUDA kernel's compiled-in defaults with the standalone harness, for
# choosing them on a lent GPU. Every build is also checked bit for bit (the harness's
# correctness part). Builds run in parallel; timings one at a time. Output under $OUT (or /tmp).
#   scripts/gpu_sweep.sh launch   threads per block x 16-byte words each thread keeps in flight
#                                 (tf_amp/cc/unscale_and_check_finite_gpu.cu.cc)
#   scripts/gpu_sweep.sh chunks   elements per chunk (tf_amp/cc/unscale_kernels_gpu.h)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-launch}
out=${OUT:-/tmp/tf_amp_gpu_sweep}
mkdir -p "$out"
build_dir=$(mktemp -d)
arch=-arch=native
nvidia-smi -L >/dev/null 2>&1 || arch=-arch=sm_90  # no GPU to build for natively: H100/H200
variants=()  # name|nvcc -D flags
case "$what" in
  launch)
    for threads in 256 512 1024; do
      for words in 1 2 4 8; do
        variants+=("threads_words_${threads}_${words}|-DTF_AMP_GPU_THREADS_PER_BLOCK=$threads -DTF_AMP_GPU_WORDS_IN_FLIGHT=$words")
      done
    done ;;
  chunks)
    for chunk in 16384 32768 65536; do
      variants+=("chunk_${chunk}|-DTF_AMP_GPU_CHUNK_ELEMENTS=$chunk")
    done ;;
  *) echo "usage: $0 [launch|chunks]" >&2; exit 2 ;;
esac
for variant in "${variants[@]}"; do
  # shellcheck disable=SC2086  # the flags are words
  nvcc -std=c++17 -O3 "$arch" -I. ${variant#*|} -o "$build_dir/${variant%%|*}" \
    tf_amp/cc/harness/unscale_harness.cu -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc &
done
wait
{
  status=0
  for variant in "${variants[@]}"; do
    echo "== ${variant%%|*}"
    "$build_dir/${variant%%|*}" resnet50 bert-base || status=1
  done
  exit "$status"
} 2>&1 | tee "$out/sweep_$what.txt"
exit "${PIPESTATUS[0]}"
