"""Excluding a region keeps its backward pass float32 too, not only its forward ops.

    x ─► [keep_fp32/kept MatMul] ─► h ─► [converted MatMul] ─► loss
    backward: gradient_tape/keep_fp32/kept/...  (float32, like its forward op)
              gradient_tape/converted/...        (float16)
"""

from __future__ import annotations

import tensorflow as tf

import tf_amp
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def


def _matmul_dtypes(graph_def) -> dict[str, str]:
    return {n.name: tf.dtypes.as_dtype(n.attr["T"].type).name
            for n in graph_def.node if n.op == "MatMul"}


def _tape_step_graph(region):
    w, v = tf.Variable(tf.ones([4, 4])), tf.Variable(tf.ones([4, 4]))

    def step(x):
        with tf.GradientTape() as tape:
            with region():
                h = tf.matmul(x, w, name="kept")
            loss = tf.reduce_sum(tf.matmul(h, v, name="converted"))
        return tape.gradient(loss, [w, v])

    return tf.function(step).get_concrete_function(tf.TensorSpec([4, 4])).graph.as_graph_def()


def _assert_region_float32_everywhere(dtypes: dict[str, str]) -> None:
    kept = {name: dt for name, dt in dtypes.items() if "kept" in name}
    converted = {name: dt for name, dt in dtypes.items() if "converted" in name}
    assert any(name.startswith("gradient_tape/") for name in kept), dtypes  # backward exists
    assert set(kept.values()) == {"float32"}, dtypes
    assert set(converted.values()) == {"float16"}, dtypes


def test_excluded_name_scope_keeps_its_gradient_ops_float32():
    graph_def = _tape_step_graph(lambda: tf.name_scope("keep_fp32"))
    result = rewrite_graph_def(graph_def, RewriteConfig(exclude_scopes=("keep_fp32",)))
    _assert_region_float32_everywhere(_matmul_dtypes(result.graph_def))


def test_keep_float32_attribute_region_keeps_its_gradient_ops_float32():
    graph_def = _tape_step_graph(tf_amp.keep_float32)
    _assert_region_float32_everywhere(_matmul_dtypes(rewrite_graph_def(graph_def).graph_def))


def test_tf1_gradients_of_an_excluded_scope_stay_float32():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 4], use_resource=True)
        with tf.name_scope("keep_fp32"):
            h = tf.matmul(x, w, name="kept")
        loss = tf.reduce_sum(tf.matmul(h, h, name="converted"))
        tf.compat.v1.gradients(loss, [w])
    result = rewrite_graph_def(graph.as_graph_def(),
                               RewriteConfig(exclude_scopes=("keep_fp32",)))
    dtypes = _matmul_dtypes(result.graph_def)
    kept_grads = {n: d for n, d in dtypes.items() if n.startswith("gradients/keep_fp32/")}
    assert kept_grads and set(kept_grads.values()) == {"float32"}, dtypes
    assert dtypes["converted"] == "float16"
