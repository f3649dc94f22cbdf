#!/usr/bin/env bash
# Does the CUDA harness catch a wrong kernel? Builds copies of the kernel, each with one known
# bug, and runs the harness's correctness part (--check-only) on each: every one must fail.
# A check that passes a broken kernel proves nothing. Output under $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tf_amp_gpu_mutants}
mkdir -p "$out"
work=$(mktemp -d)
source_file=tf_amp/cc/unscale_and_check_finite_gpu.cu.cc
arch=-arch=native
nvidia-smi -L >/dev/null 2>&1 || arch=-arch=sm_90  # no GPU to build for natively: H100/H200

# name|sed expression (each must change the source: checked below)
last_word_unchecked="s/bool bad = false;/bool bad = false, ignored = false;/;s/UnscaleWord<T>(data\[k\], inv, inv_double, bad)/UnscaleWord<T>(data[k], inv, inv_double, k == kWordsInFlight - 1 ? ignored : bad)/"
# A launch shape other than the default (gpu_sweep.sh builds them): the checks follow it.
declare -A nvcc_flags=(
  [last_word_unchecked_8_in_flight_1024_threads]="-DTF_AMP_GPU_WORDS_IN_FLIGHT=8 -DTF_AMP_GPU_THREADS_PER_BLOCK=1024"
)
mutants=(
  "grid_stride_skips_chunks|s/chunk += gridDim.x/chunk += total_chunks/"
  "later_words_unchecked|s/bool bad = false;/bool bad = false, ignored = false;/;s/UnscaleWord<T>(data\[k\], inv, inv_double, bad)/UnscaleWord<T>(data[k], inv, inv_double, k == 0 ? bad : ignored)/"
  "last_word_unchecked|$last_word_unchecked"
  "last_word_unchecked_8_in_flight_1024_threads|$last_word_unchecked"
  "flag_overwritten_per_chunk|s/bad |= UnscaleChunk/bad = UnscaleChunk/g"
  "tail_misses_last_element|s/for (int64_t j = i + threadIdx.x; j < end;/for (int64_t j = i + threadIdx.x; j < end - 1;/"
  "half_rounds_toward_zero|s/__float2half_rn(__half2float/__float2half_rz(__half2float/"
)
for entry in "${mutants[@]}"; do
  name=${entry%%|*}
  edit=${entry#*|}
  flags=${nvcc_flags[$name]:-}
  mkdir -p "$work/$name/tf_amp/cc"
  cp tf_amp/cc/*.h "$work/$name/tf_amp/cc/"
  sed -e "$edit" "$source_file" > "$work/$name/kernel.cu.cc"
  if cmp -s "$source_file" "$work/$name/kernel.cu.cc"; then
    echo "mutant $name: the edit matched nothing (update this script)"; exit 2
  fi
  # shellcheck disable=SC2086  # the flags are words
  nvcc -std=c++17 -O3 "$arch" $flags -I"$work/$name" -o "$work/$name/harness" \
    tf_amp/cc/harness/unscale_harness.cu -x cu "$work/$name/kernel.cu.cc" &
done
wait
for entry in "${mutants[@]}"; do  # at once: each is mostly host work
  name=${entry%%|*}
  (cd "$work/$name" && ./harness --check-only > "$out/mutant_$name.txt" 2>&1
   echo $? > "$work/$name/status") &
done
wait
missed=0
for entry in "${mutants[@]}"; do
  name=${entry%%|*}
  status=$(cat "$work/$name/status")
  if [ "$status" -eq 1 ]; then
    echo "mutant $name: caught ($(grep -m1 -E 'differs|not detected|flagged' "$out/mutant_$name.txt" | sed 's/^ *//'))"
  else
    echo "mutant $name: MISSED (harness exit status $status)"; missed=1
  fi
done
exit "$missed"
