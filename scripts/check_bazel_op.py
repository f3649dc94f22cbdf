"""Checks that the Bazel-built op library computes what the setup.py-built one does, bit for bit.

Both libraries register the same op, so each is loaded in its own interpreter: one loads
``bazel-bin/_tf_amp_ops.so`` directly with ``tf.load_op_library``, the other goes through
``tf_amp.ops`` (the library ``pip install -e .`` built). Every supported dtype, odd lengths
(vectorised kernels' tails) and special values (overflow on unscaling, inf, nan).

    bash scripts/configure_bazel.sh && bazel build //:tf_amp_ops && python scripts/check_bazel_op.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

COMPUTE = r"""
import sys
import numpy as np
import tensorflow as tf

library, out_path = sys.argv[1], sys.argv[2]
if library == "tf_amp":
    from tf_amp import ops
    assert ops.native_op_available(), "tf_amp's own op library did not load"
    def unscale(values, scale):
        return ops.unscale_and_check_finite(values, scale, use_native=True)
else:
    module = tf.load_op_library(library)
    def unscale(values, scale):
        return module.tf_amp_unscale_and_check_finite(values, scale)

rng = np.random.default_rng(11)
special = np.array([0.0, -0.0, 1e-8, 6e-8, 65504.0, 65520.0, 1e30, np.inf, -np.inf, np.nan])
results = {}
for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
    finite = rng.standard_normal(1003) * 1e3
    for label, values, scale in (("finite", finite, 0.75),
                                 ("special", np.concatenate([finite, special]), 0.75),
                                 ("overflow", finite, 1e-30)):
        unscaled, all_finite = unscale([tf.constant(values, dtype)], tf.constant(scale))
        results[f"{dtype.name}_{label}"] = unscaled[0].numpy().view(np.uint8)
        results[f"{dtype.name}_{label}_finite"] = np.array(bool(all_finite.numpy()))
np.savez(out_path, **results)
"""


def compute(library: str, out_path: str) -> dict[str, np.ndarray]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, "-c", COMPUTE, library, out_path], env=env, check=True)
    with np.load(out_path) as data:
        return {name: data[name] for name in data.files}


def main() -> int:
    default = "bazel-bin/_tf_amp_ops.so"
    bazel_library = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else default)
    if not os.path.exists(bazel_library):
        print(f"error: {bazel_library} not found: run `bazel build //:tf_amp_ops` first")
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        ours = compute("tf_amp", os.path.join(scratch, "setup_py.npz"))
        bazel = compute(bazel_library, os.path.join(scratch, "bazel.npz"))
    assert ours.keys() == bazel.keys()
    differ = [name for name in ours if not np.array_equal(ours[name], bazel[name])]
    if differ:
        print(f"error: the Bazel-built op differs from setup.py's in: {', '.join(differ)}")
        return 1
    print(f"Bazel-built op matches setup.py's bit for bit ({len(ours)} results)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
