#!/usr/bin/env bash
# Every check of the CUDA kernel in one run, for a CUDA machine without TensorFlow (nvcc,
# PyTorch): compile the kernel's standalone harness for the GPU at hand, run it (bit-exactness
# of every dtype against the host reference, inf/nan detection, time against a device copy on
# ResNet-50's and BERT-base's gradient lists), the correctness part again under
# compute-sanitizer (memcheck, racecheck), then PyTorch's fused unscale and the unfused
# per-tensor way on the same lists (bench/gpu_torch_reference.py). Output is printed and written
# under $OUT (or /tmp), so that a lent machine's short session brings the figures back in one
# call. Exit status: 1 when a correctness or sanitizer check failed, 2 when nothing compiled.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tf_amp_gpu_check}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
harness=$(mktemp -d)/unscale_harness

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvcc --version | tail -n 1 | tee -a "$out/gpu.txt"
# -arch=native: code for the GPU at hand (no PTX JIT at start-up); sm_90 (H100/H200) where
# this nvcc predates the flag.
build() {
  nvcc -std=c++17 -O3 "$1" -I. -o "$harness" tf_amp/cc/harness/unscale_harness.cu \
    -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc
}
build -arch=native || build -arch=sm_90 || { echo "error: the harness did not compile" >&2; exit 2; }

"$harness" resnet50 bert-base 2>&1 | tee "$out/harness.txt"
status=${PIPESTATUS[0]}
# The correctness part again under compute-sanitizer: out-of-bounds or misaligned accesses and
# shared-memory races that happen to give right answers. A finding makes the check fail.
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 180 compute-sanitizer --tool "$tool" --error-exitcode 3 "$harness" --check-only \
      2>&1 | tail -n 15 | tee "$out/sanitizer_$tool.txt"
    sanitizer_status=${PIPESTATUS[0]}
    echo "compute-sanitizer $tool exit status: $sanitizer_status"
    [ "$sanitizer_status" -eq 0 ] || status=1
  done
else
  echo "compute-sanitizer not found: sanitizer checks not run"
fi
python3 bench/gpu_torch_reference.py 2>&1 | tee "$out/torch_reference.txt"
echo "harness exit status: $status (figures under $out)"
exit "$status"
