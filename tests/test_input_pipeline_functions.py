"""tf.data's functions (``map``, ``reduce``...) are left as they are, as TensorFlow's pass
leaves them (``tf_amp.type_attrs.exclude.input_pipeline_functions``)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_amp
from tf_amp import RewriteConfig
from tf_amp.type_attrs.exclude import input_pipeline_functions

HALF = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}


def _half_nodes(function_def) -> list[str]:
    return [n.name for n in function_def.node_def
            if n.op != "Cast" and any(v.type in HALF for v in n.attr.values())]


def test_a_map_function_is_left_and_a_reduce_is_a_loop_with_a_float32_running_sum():
    """A Dataset.reduce summing 3,000 small MatMul results came out 4.0 in bfloat16 (30.0006
    in float32): its function was painted like a model's, its running sum included. The map
    function before it, input pipeline work, is left as TensorFlow's pass leaves it."""
    w = tf.Variable(tf.eye(4))
    x = tf.fill((1, 4), 0.01)

    def fn(x):
        steps = tf.data.Dataset.range(3000).map(lambda i: tf.matmul(x, w))
        return steps.reduce(tf.zeros((1, 4)), lambda acc, product: acc + tf.matmul(product, w))

    amp = tf_amp.function(fn, config=RewriteConfig(target_dtype="bfloat16"))
    np.testing.assert_allclose(amp(x), tf.function(fn)(x), rtol=3e-3)  # bfloat16 products
    graph_def = amp.rewritten_concrete_functions()[0].graph.as_graph_def()
    bodies = {f.signature.name: f for f in graph_def.library.function}
    (mapped,) = [f for name, f in bodies.items() if "map" in name.lower()]
    (reduced,) = [f for name, f in bodies.items() if "reduce" in name.lower()]
    assert _half_nodes(mapped) == []
    assert "MatMul" in _half_nodes(reduced)


def test_a_training_loop_over_a_dataset_in_a_function_is_rewritten():
    """``for x in dataset:`` in a tf.function runs as a scan and a reduce over the dataset,
    both marked as tf.data functions: left as tf.data's, the whole training loop ran float32."""
    w = tf.Variable(tf.random.stateless_normal((32, 32), seed=(1, 2)) * 0.1)
    data = tf.data.Dataset.from_tensor_slices(tf.random.stateless_normal((6, 8, 32), (3, 4)))

    def train(data):
        total = tf.constant(0.0)
        for x in data:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
            w.assign_sub(0.01 * tape.gradient(loss, w))
            total += loss
        return total

    amp = tf_amp.function(train, config=RewriteConfig(target_dtype="float16"))
    amp(data)
    (report,) = amp.reports
    assert sum(d.op == "MatMul" and d.dtype == "float16" for d in report.decisions) >= 2


def test_a_function_only_the_pipeline_calls_is_left_one_the_model_calls_is_rewritten():
    @tf.function
    def only_in_map(v):
        return tf.matmul(v, v)

    @tf.function
    def shared(v):
        return tf.matmul(v, v) + 1.0

    def fn(x):
        ds = tf.data.Dataset.from_tensors(x).map(lambda v: shared(only_in_map(v)))
        return next(iter(ds)) + shared(x)

    graph_def = tf.function(fn).get_concrete_function(
        tf.TensorSpec((2, 2), tf.float32)).graph.as_graph_def()
    names = {f.signature.name for f in graph_def.library.function}
    left = input_pipeline_functions(graph_def)
    assert any("only_in_map" in name for name in left)
    assert not any("shared" in name for name in left)
    assert any("shared" in name for name in names)
    assert all(name in names for name in left)


def test_the_converted_lines_node_count_leaves_the_pipeline_out_whatever_the_target():
    """The Y of "Converted X/Y nodes" counted the pipeline's functions when nothing was
    painted (O0, a float32 target) and not when something was: 21 against 15."""
    from tf_amp.rewriter import rewrite_graph_def

    w = tf.ones([8, 8])

    @tf.function
    def f(x):
        ds = tf.data.Dataset.range(3).map(lambda v: tf.cast(v, tf.float32) * 2.0 + 1.0)
        return tf.matmul(x, w) * ds.reduce(0.0, lambda a, b: a + b)

    graph_def = f.get_concrete_function(tf.TensorSpec([4, 8])).graph.as_graph_def()
    counts = {
        level: rewrite_graph_def(graph_def, RewriteConfig(
            target_dtype="float16", check_kernels=False, opt_level=level)).report.nodes_before
        for level in ("O1", "O0")
    }
    assert counts["O1"] == counts["O0"], counts
