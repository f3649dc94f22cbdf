#!/usr/bin/env bash
# Creates .venv, installs TensorFlow and tf_amp (building its native op against that
# TensorFlow), and checks that the op loads. Safe to run again.
#   TF_PACKAGE     the TensorFlow distribution (default tensorflow-cpu==2.21.*; a GPU machine
#                  wants 'tensorflow[and-cuda]==2.21.*')
#   KERAS_PACKAGE  the Keras to install with it (default: the newest that TensorFlow accepts),
#                  and any other requirement, space-separated; the oldest supported pair is
#                  TF_PACKAGE='tensorflow-cpu==2.19.*' KERAS_PACKAGE='keras==3.7.0 setuptools<81'
#                  VENV=.venv-tf219; TensorFlow 2.20 also needs 'protobuf<7' (README,
#                  Supported versions)
#   VENV           the virtual environment to create (default .venv)
#   PYTHON         the interpreter that creates the venv (default python3)
# Also installs tf_keras (Keras 2), matched to TensorFlow, for the tf_keras tests.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
tf_package=${TF_PACKAGE:-tensorflow-cpu==2.21.*}
keras_package=${KERAS_PACKAGE:-}
venv=${VENV:-.venv}

command -v "$python" >/dev/null || { echo "error: $python not found: install Python 3.10-3.12" >&2; exit 1; }
command -v "${CXX:-g++}" >/dev/null || {
  echo "error: no C++ compiler (${CXX:-g++}) to build tf_amp's native op: apt-get install g++" >&2
  exit 1
}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
# One resolve, so that pip picks a Keras this TensorFlow accepts (or refuses the pair).
# shellcheck disable=SC2086 # KERAS_PACKAGE may hold several requirements
"$venv/bin/python" -m pip install -q "$tf_package" $keras_package
# --no-build-isolation: the op is compiled with the installed TensorFlow's headers and flags.
"$venv/bin/python" -m pip install -q --no-build-isolation -e ".[test]"
# tf_keras (Keras 2) for its tests, matched to the installed TensorFlow's major.minor. --no-deps:
# tf-keras depends on the `tensorflow` distribution, which would replace tensorflow-cpu's files.
tf_minor=$("$venv/bin/python" -c "import importlib.metadata as m, sys
for d in ('tensorflow-cpu', 'tensorflow'):
    try: v = m.version(d)
    except m.PackageNotFoundError: continue
    print('.'.join(v.split('.')[:2])); sys.exit()
sys.exit('no TensorFlow distribution found')")
"$venv/bin/python" -m pip install -q --no-deps "tf-keras==${tf_minor}.*"
TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c \
  "import tf_amp.ops as o; assert o.native_op_available(), 'native op did not load'; print('tf_amp ready: native op loaded')"
