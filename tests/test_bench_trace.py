"""``bench/_trace.py``: reading a profiler trace of a step, and the allow-list ops' share of it
that ``bench/train_speed.py`` turns into the Amdahl limit.

The trace is a real one (TensorFlow's profiler around a ``tf.function``), so a change in the
trace's format that the reader no longer understands fails here, not silently in the bench.
"""

from __future__ import annotations

import os
import sys

import pytest
import tensorflow as tf

from tf_amp.lists import OpLists

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
from _trace import node_times, op_time_share, traced_base_ops  # noqa: E402


@pytest.mark.parametrize(
    ("kernel", "names"),
    [
        ("_MklMatMul", ["MatMul"]),
        ("_MklNativeFusedConv2D", ["FusedConv2D", "Conv2D"]),
        ("_MklNativeConv2DBackpropFilterWithBias",
         ["Conv2DBackpropFilterWithBias", "Conv2DBackpropFilter"]),
        ("_FusedMatMul", ["FusedMatMul", "MatMul"]),
        ("Mul", ["Mul"]),
    ],
)
def test_traced_kernels_name_the_ops_they_run(kernel: str, names: list[str]) -> None:
    assert traced_base_ops(kernel) == names


def test_share_of_allow_ops_in_a_real_trace(tmp_path) -> None:
    a = tf.random.normal((256, 256))

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        y = tf.matmul(x, x)
        return tf.reduce_sum(tf.tanh(y) * y + x)

    step(a)  # traced and optimized before the profile
    steps = 3
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(steps):
        step(a)
    tf.profiler.experimental.stop()

    ms_by_op, runs, by_node = node_times(str(tmp_path), steps)
    lists = OpLists.default("bfloat16")
    allow_ms, total_ms = op_time_share(ms_by_op, lists.category)
    matmul_kernels = [op for op in ms_by_op if "MatMul" in traced_base_ops(op)]
    assert matmul_kernels, f"no MatMul kernel in the trace: {sorted(ms_by_op)}"
    assert all(runs[op] == 1 for op in matmul_kernels)  # one per step
    assert allow_ms == pytest.approx(sum(ms_by_op[op] for op in matmul_kernels))
    assert 0 < allow_ms < total_ms  # the elementwise ops and the reduction count too
    assert sum(by_node.values()) == pytest.approx(total_ms)
