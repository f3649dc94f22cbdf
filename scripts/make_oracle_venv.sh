#!/usr/bin/env bash
# Creates .venv-tf-gpu: a second virtual environment holding the CUDA build of TensorFlow 2.21
# (pip `tensorflow`, not `tensorflow-cpu`). It is the differential tests' reference for
# TensorFlow's real GPU auto_mixed_precision pass: that pass only runs for nodes placed on a GPU
# in a cluster that has one, and the CPU wheel has no GPU device code at all, while the CUDA
# wheel runs the pass against a *virtual* GPU on a machine without one
# (tests/_gpu_oracle.py). Nothing of tf_amp is installed there: the runner only needs
# TensorFlow. Safe to run again. (~600 MB of wheels; see the README for the time it takes.)
#   PYTHON  the interpreter that creates the venv (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "error: $python not found: install Python 3.10-3.12" >&2; exit 1; }
[ -x .venv-tf-gpu/bin/python ] || "$python" -m venv .venv-tf-gpu
.venv-tf-gpu/bin/python -m pip install -q --upgrade pip
# Plain `tensorflow` is the CUDA build; without the `[and-cuda]` extra no CUDA libraries are
# downloaded (Grappler needs none of them).
.venv-tf-gpu/bin/python -m pip install -q 'tensorflow==2.21.*'
TF_CPP_MIN_LOG_LEVEL=2 .venv-tf-gpu/bin/python -c \
  "import tensorflow as tf; assert tf.test.is_built_with_cuda(), 'not the CUDA build'; print('oracle venv ready: TensorFlow', tf.__version__, 'built with CUDA')"
