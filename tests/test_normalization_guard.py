"""The normalization guard: which nodes it keeps float32, why it matters, and its switches."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def


def _normalized_between_matmuls(offset: bool = True) -> tf.types.experimental.ConcreteFunction:
    """MatMul -> batch normalization over the batch (as Keras calls it: with a scale, so
    ``inv = rsqrt(var + eps) * scale``, ``mul_1 = x * inv``, ``add_1 = mul_1 + shift``) ->
    MatMul, on features far from zero: where x * inv and mean * inv nearly cancel."""
    rng = np.random.default_rng(0)
    w1 = np.eye(16, dtype=np.float32)
    w2 = rng.standard_normal((16, 8)).astype(np.float32) / 4
    beta = np.full(16, 0.5, np.float32)
    gamma = np.full(16, 1.5, np.float32)

    @tf.function(input_signature=[tf.TensorSpec([64, 16], tf.float32)])
    def step(x: tf.Tensor) -> tf.Tensor:  # the weights are Consts of the graph
        h = tf.matmul(x, tf.constant(w1))
        mean, var = tf.nn.moments(h, axes=[0])
        y = tf.nn.batch_normalization(
            h, mean, var, tf.constant(beta) if offset else None, tf.constant(gamma), 1e-3)
        return tf.identity(tf.matmul(y, tf.constant(w2)), name="out")

    return step.get_concrete_function()


def _features() -> np.ndarray:
    """Values near 300 that float16 holds exactly (its spacing there is 0.25), so that the
    first MatMul (identity weights) rounds nothing and the normalization's rounding is what
    the output error measures; standard deviation ~1.2, mean ~250 of them from zero."""
    rng = np.random.default_rng(1)
    return (300.0 + 0.25 * rng.integers(-8, 9, (64, 16))).astype(np.float32)


def _run(graph_def: tf.compat.v1.GraphDef, x: np.ndarray) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    placeholder = next(op for op in graph.get_operations() if op.type == "Placeholder")
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run("out:0", {placeholder.outputs[0]: x})


def _rewrite(fn: tf.types.experimental.ConcreteFunction, **config: object):
    cfg = RewriteConfig(target_dtype="float16", preserve_nodes=frozenset({"out"}),
                        check_kernels=False, **config)
    return rewrite_graph_def(fn.graph.as_graph_def(), cfg)


def _dtypes(graph_def: tf.compat.v1.GraphDef, name: str) -> list[int]:
    return [n.attr["T"].type for n in graph_def.node if n.name == name]


@pytest.mark.parametrize("offset", [True, False], ids=["offset", "no-offset"])
def test_guard_keeps_exactly_the_cancelling_sum_float32(offset: bool) -> None:
    fn = _normalized_between_matmuls(offset)
    guarded = _rewrite(fn)
    painted = _rewrite(fn, guard_normalization=False)
    half, single = tf.float16.as_datatype_enum, tf.float32.as_datatype_enum
    # TensorFlow's painting (pass 4: an infer op fed by the half MatMul) turns x * inv half;
    # the sum is float32 there anyway (fed by the float32 statistics)
    assert _dtypes(painted.graph_def, "batchnorm/mul_1") == [half]
    assert _dtypes(guarded.graph_def, "batchnorm/mul_1") == [single]
    assert _dtypes(guarded.graph_def, "batchnorm/add_1") == [single]
    blocked = sorted(name for body in guarded.report.bodies
                     for n, name in enumerate(body.view.names)
                     if body.painting.node_block[n] == "normalization")
    assert blocked == ["batchnorm/add_1", "batchnorm/mul_1"]
    # everything else is painted as before
    for name in ("MatMul", "MatMul_1", "batchnorm/mul", "batchnorm/sub"):
        assert _dtypes(guarded.graph_def, name) == _dtypes(painted.graph_def, name), name
    assert _dtypes(guarded.graph_def, "MatMul") == [half]
    decision = guarded.report.decision_for("batchnorm/mul_1", "T")
    assert "normalization" in decision.reason and "cancel" in decision.reason


def test_guard_brings_the_output_back_to_float32s_accuracy() -> None:
    fn = _normalized_between_matmuls()
    x = _features()
    reference = _run(fn.graph.as_graph_def(), x)
    errors = {}
    for guard in (True, False):
        out = _run(_rewrite(fn, guard_normalization=guard).graph_def, x)
        errors[guard] = float(np.abs(out - reference).max() / np.abs(reference).max())
    # painted half, x * inv (~250 after normalization's scale) rounds by up to 0.125: a
    # large share of an output of order one
    assert errors[False] > 0.02, errors
    # guarded, only the second MatMul rounds: float16's ordinary ~1e-3
    assert errors[True] < 0.005, errors
    assert errors[True] * 5 < errors[False], errors


def test_guard_defaults_per_target_and_switches() -> None:
    assert RewriteConfig(target_dtype="float16").guards_normalization
    assert not RewriteConfig(target_dtype="bfloat16").guards_normalization
    assert RewriteConfig(target_dtype="bfloat16", guard_normalization=True).guards_normalization
    env = {"TF_AMP_TARGET_DTYPE": "float16", "TF_AMP_GUARD_NORMALIZATION": "0"}
    assert not RewriteConfig.from_env(env).guards_normalization
    env["TF_AMP_GUARD_NORMALIZATION"] = "1"
    assert RewriteConfig.from_env({**env, "TF_AMP_TARGET_DTYPE": "bfloat16"}).guards_normalization
    with pytest.raises(ValueError, match="TF_AMP_GUARD_NORMALIZATION"):
        RewriteConfig.from_env({**env, "TF_AMP_GUARD_NORMALIZATION": "maybe"})


def test_o3_paints_the_normalization_too() -> None:
    """O3 asks for every op with a half kernel: the guard does not override it."""
    result = _rewrite(_normalized_between_matmuls(), opt_level="O3")
    assert _dtypes(result.graph_def, "batchnorm/add_1") == [tf.float16.as_datatype_enum]


def test_the_backward_multiplication_by_the_uncentred_input_stays_float32() -> None:
    # dy * x, the gradient of inv, multiplies a loss-scaled gradient by x itself (a mean of
    # 300 here): painted half, its products overflowed float16 where float32 stays finite.
    w2 = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([64, 16], tf.float32)])
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = tf.matmul(x, tf.eye(16))
            mean, var = tf.nn.moments(h, axes=[0])
            y = tf.nn.batch_normalization(h, mean, var, tf.zeros(16), tf.ones(16), 1e-3)
            loss = tf.reduce_sum(tf.matmul(y, tf.constant(w2))) * 2.0**15
        return tf.identity(tape.gradient(loss, x), name="out")

    graph_def = step.get_concrete_function().graph.as_graph_def()
    report = _rewrite(step.get_concrete_function()).report
    backward = [n.name for n in graph_def.node
                if n.op == "Mul" and n.name.startswith("gradient_tape/")
                and n.name.endswith("batchnorm/mul_1/Mul_1")]
    assert backward, "no dy * x node: the test no longer tests the backward"
    assert report.decision_for(backward[0], "T").dtype == "float32"
    assert "normaliz" in report.decision_for(backward[0], "T").reason
    unguarded = _rewrite(step.get_concrete_function(), guard_normalization=False).report
    assert unguarded.decision_for(backward[0], "T").dtype == "float16"
