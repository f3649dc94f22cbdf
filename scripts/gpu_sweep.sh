#!/usr/bin/env bash
# Times the CUDA kernel's launch shapes with the standalone harness, for choosing the defaults in
# tf_amp/cc/unscale_and_check_finite_gpu.cu.cc on a lent GPU: threads per block x 16-byte words
# each thread keeps in flight. Every build is also checked bit for bit (the harness's
# correctness part). Builds run in parallel; timings one at a time. Output under $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tf_amp_gpu_sweep}
mkdir -p "$out"
build_dir=$(mktemp -d)
arch=-arch=native
nvidia-smi -L >/dev/null 2>&1 || arch=-arch=sm_90  # no GPU to build for natively: H100/H200
shapes=()
for threads in 256 512 1024; do
  for words in 1 2 4 8; do
    shapes+=("${threads}_${words}")
    nvcc -std=c++17 -O3 "$arch" -I. -DTF_AMP_GPU_THREADS_PER_BLOCK="$threads" \
      -DTF_AMP_GPU_WORDS_IN_FLIGHT="$words" -o "$build_dir/harness_${threads}_${words}" \
      tf_amp/cc/harness/unscale_harness.cu -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc &
  done
done
wait
{
  status=0
  for shape in "${shapes[@]}"; do
    echo "== threads_words $shape"
    "$build_dir/harness_$shape" resnet50 bert-base || status=1
  done
  exit "$status"
} 2>&1 | tee "$out/sweep.txt"
exit "${PIPESTATUS[0]}"
