"""The update guard: which nodes it keeps float32, where its walk stops, and its switches."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from tests import _model_graphs
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def

BF16 = tf.bfloat16.as_datatype_enum
FP32 = tf.float32.as_datatype_enum


def _adam_like_step() -> tf.compat.v1.GraphDef:
    """A Dense layer's gradient feeding a hand-written Adam step and a bias momentum: the
    weight gradient comes out of a MatMul (allow list), the bias gradient out of BiasAddGrad."""
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.standard_normal((16, 16)).astype(np.float32), name="w")
    w2 = tf.constant(rng.standard_normal((16, 4)).astype(np.float32))
    b = tf.Variable(np.zeros(16, np.float32), name="b")
    m = tf.Variable(np.zeros((16, 16), np.float32), name="m")
    v = tf.Variable(np.zeros((16, 16), np.float32), name="v")
    mb = tf.Variable(np.zeros(16, np.float32), name="mb")

    @tf.function(input_signature=[tf.TensorSpec([8, 16], tf.float32)])
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            h = tf.nn.bias_add(tf.matmul(x, w), b)
            loss = tf.reduce_sum(tf.matmul(h, w2))
        gw, gb = tape.gradient(loss, [w, b])
        m.assign_add(tf.subtract(gw, m, name="g_minus_m") * 0.1)
        v.assign_add((tf.square(gw, name="g_squared") - v) * 0.001)
        w.assign_sub(0.01 * m / (tf.sqrt(v) + 1e-7))
        mb.assign_add(tf.subtract(gb, mb, name="gb_minus_mb") * 0.1)
        return tf.identity(loss, name="out")

    return step.get_concrete_function().graph.as_graph_def()


def _rewrite(graph_def: tf.compat.v1.GraphDef, **config: object):
    cfg = RewriteConfig(target_dtype="bfloat16", preserve_nodes=frozenset({"out"}),
                        check_kernels=False, **config)
    return rewrite_graph_def(graph_def, cfg)


def _dtype(graph_def: tf.compat.v1.GraphDef, name: str) -> int:
    (node,) = [n for n in graph_def.node if n.name == name]
    return node.attr["T"].type


def _state_reads_cast_to_half(graph_def: tf.compat.v1.GraphDef) -> list[str]:
    """Casts to bfloat16 of a read of the optimizer state: the variables that
    ``AssignAddVariableOp`` updates (m, v, mb; the weight w is updated by AssignSub)."""
    producers = {n.name: n for n in graph_def.node}
    state = {n.input[0] for n in graph_def.node if n.op == "AssignAddVariableOp"}
    assert len(state) == 3
    casts = []
    for node in graph_def.node:
        if node.op == "Cast" and node.attr["DstT"].type == BF16:
            source = producers[node.input[0].split(":")[0]]
            if source.op == "ReadVariableOp" and source.input[0] in state:
                casts.append(node.name)
    return casts


def test_update_only_arithmetic_stays_float32_where_tensorflow_paints_it() -> None:
    graph_def = _adam_like_step()
    guarded = _rewrite(graph_def)
    painted = _rewrite(graph_def, guard_updates=False)
    # TensorFlow's pass 4 paints what the half weight gradient feeds, reading m through a Cast
    assert _dtype(painted.graph_def, "g_minus_m") == BF16
    assert _dtype(painted.graph_def, "g_squared") == BF16
    assert _state_reads_cast_to_half(painted.graph_def)
    # the guard keeps the update float32 and casts the gradient once instead
    for name in ("g_minus_m", "g_squared", "gb_minus_mb"):
        assert _dtype(guarded.graph_def, name) == FP32, name
    assert _state_reads_cast_to_half(guarded.graph_def) == []
    decision = guarded.report.decision_for("g_minus_m", "T")
    assert "serves only variable updates" in decision.reason
    assert guarded.report.casts_to_float <= painted.report.casts_to_float


def test_the_walk_stops_at_allow_ops_and_reductions() -> None:
    guarded = _rewrite(_adam_like_step()).graph_def
    matmuls = [n for n in guarded.node if n.op == "MatMul"]
    assert len(matmuls) >= 3  # forward, and the gradients for x-side and w
    assert all(n.attr["T"].type == BF16 for n in matmuls), "weight gradients keep bfloat16"
    (bias_grad,) = [n for n in guarded.node if n.op == "BiasAddGrad"]
    # reducing in bfloat16 and casting the [16] result is cheaper than casting its input
    assert bias_grad.attr["T"].type == BF16


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, True),
    ({"guard_updates": False}, False),
    ({"opt_level": "O3"}, False),
    ({"level": "UNSAFE_FORCE_ALL"}, False),
])
def test_switches(changes: dict[str, object], expected: bool) -> None:
    result = _rewrite(_adam_like_step(), **changes)
    assert (_dtype(result.graph_def, "g_minus_m") == FP32) is expected


def test_defaults_per_target_and_environment() -> None:
    assert RewriteConfig(target_dtype="bfloat16").guards_updates
    assert not RewriteConfig(target_dtype="float16").guards_updates  # TensorFlow's GPU pass
    assert RewriteConfig(target_dtype="float16", guard_updates=True).guards_updates
    env = {"TF_AMP_TARGET_DTYPE": "bfloat16", "TF_AMP_GUARD_UPDATES": "0"}
    assert not RewriteConfig.from_env(env).guards_updates
    env = {"TF_AMP_TARGET_DTYPE": "float16", "TF_AMP_GUARD_UPDATES": "1"}
    assert RewriteConfig.from_env(env).guards_updates
    with pytest.raises(ValueError, match="TF_AMP_GUARD_UPDATES"):
        RewriteConfig.from_env({"TF_AMP_GUARD_UPDATES": "sometimes"})


def test_keras_optimizer_step_and_moving_statistics_stay_float32() -> None:
    """A real Keras CNN step (BatchNormalization, SGD with momentum): the update-only nodes
    (here the moving statistics' arithmetic) are float32 where TensorFlow's painting makes
    some bfloat16, and every optimizer op that computes anything stays float32."""
    model = _model_graphs.keras_cnn()
    cfg = RewriteConfig(target_dtype="bfloat16", preserve_nodes=frozenset(model.fetches),
                        check_kernels=False)
    result = rewrite_graph_def(model.graph_def, cfg)
    off = {n.name: n for n in rewrite_graph_def(
        model.graph_def, cfg.replace(guard_updates=False)).graph_def.node}
    guarded = {d.node for d in result.report.decisions
               if "variable updates" in d.reason and d.attr == "T"}  # (not IdentityN's T[i])
    assert any("/batch_normalization" in name for name in guarded)  # (names vary per process)
    nodes = {n.name: n for n in result.graph_def.node}
    assert all(nodes[name].attr["T"].type == FP32 for name in guarded)
    assert any(off[name].attr["T"].type == BF16 for name in guarded)
    consumed = {i.split(":")[0].lstrip("^") for n in result.graph_def.node for i in n.input}
    # (the optimizer's dead-end Identity of each gradient, read by nothing, is not its step)
    # the optimizer's scope: "sgd/", "SGD/" (older Keras) or "sgd_1/" (a second SGD in the process)
    in_optimizer = re.compile(r"sgd(_\d+)?/", re.IGNORECASE).match
    optimizer_ops = [n for n in result.graph_def.node if in_optimizer(n.name)
                     and n.name in consumed and n.op not in ("Cast", "Const")]
    assert optimizer_ops
    assert all(n.attr["T"].type != BF16 for n in optimizer_ops)
