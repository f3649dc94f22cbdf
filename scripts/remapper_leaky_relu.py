"""Reproduces TensorFlow's "remapper failed ... exist for missing node" with and without tf_amp.

Grappler's remapper (with oneDNN, the default on x86 Linux CPUs) fuses Conv2D + BiasAdd +
LeakyRelu even when the BiasAdd output has another reader, removes the BiasAdd, and its own
consistency check then rejects the whole remapper result for that graph: it logs

    remapper failed: INVALID_ARGUMENT: Mutation::Apply error: fanout 'R' exist for missing
    node '.../BiasAdd'.

and the graph runs unfused (correctly). R is whichever node also reads the BiasAdd: in Keras
training the LeakyReluGrad; after tf_amp's rewrite, when that reader is float32, tf_amp's
cast to float32 (``...-CastToFp32-tf_amp``). Each case runs in its own interpreter, so that
the C++ log lines of one do not mix with another's:

    python scripts/remapper_leaky_relu.py
"""

from __future__ import annotations

import os
import subprocess
import sys

CASE = """
import sys
import tensorflow as tf
activation, extra_reader, use_tf_amp = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
w = tf.Variable(tf.random.normal([3, 3, 3, 8]))
b = tf.Variable(tf.zeros([8]))

def step(x):
    y = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b)
    out = tf.reduce_sum({"leaky_relu": tf.nn.leaky_relu, "relu": tf.nn.relu}[activation](y))
    if extra_reader:
        out += tf.reduce_sum(tf.exp(y))  # Exp: a float32 (deny-list) reader of the BiasAdd
    return out

if use_tf_amp:
    import tf_amp
    fn = tf_amp.function(step)
else:
    fn = tf.function(step)
fn(tf.random.normal([2, 8, 8, 3]))
"""

CASES = [
    # (activation, BiasAdd has a second reader, through tf_amp, oneDNN on)
    ("leaky_relu", False, False, True),
    ("leaky_relu", True, False, True),
    ("relu", True, False, True),
    ("leaky_relu", True, False, False),
    ("leaky_relu", False, True, True),
    ("leaky_relu", True, True, True),
]


def run_case(activation: str, extra: bool, use_tf_amp: bool, onednn: bool) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "TF_AMP_TARGET_DTYPE": "bfloat16",
           "TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0"}
    result = subprocess.run(
        [sys.executable, "-c", CASE, activation, str(int(extra)), str(int(use_tf_amp))],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )
    failed = [line for line in result.stderr.splitlines() if "remapper failed" in line]
    return failed[0].split("] ", 1)[-1] if failed else "(no remapper error)"


def main() -> None:
    for activation, extra, use_tf_amp, onednn in CASES:
        label = (f"{activation:10s} second reader={extra!s:5s} tf_amp(bf16)={use_tf_amp!s:5s} "
                 f"oneDNN={onednn!s:5s}")
        print(f"{label}: {run_case(activation, extra, use_tf_amp, onednn)}", flush=True)


if __name__ == "__main__":
    main()
