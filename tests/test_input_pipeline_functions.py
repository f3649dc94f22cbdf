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


def test_a_dataset_reduce_sums_in_float32_and_the_model_around_it_is_rewritten():
    """A Dataset.reduce summing 3,000 small MatMul results came out 4.0 in bfloat16 (30.0006
    in float32): its function was painted like a model's."""
    w = tf.Variable(tf.eye(4))
    x = tf.fill((1, 4), 0.01)

    def fn(x):
        total = tf.data.Dataset.range(3000).reduce(
            tf.zeros((1, 4)), lambda acc, _: acc + tf.matmul(x, w))
        return total, tf.matmul(x, w)  # the model's own MatMul, outside the pipeline

    amp = tf_amp.function(fn, config=RewriteConfig(target_dtype="bfloat16"))
    total, _ = amp(x)
    np.testing.assert_allclose(total, tf.function(fn)(x)[0], rtol=1e-6)
    graph_def = amp.rewritten_concrete_functions()[0].graph.as_graph_def()
    data_functions = [f for f in graph_def.library.function
                      if f.attr["_tf_data_function"].b]
    assert data_functions and all(_half_nodes(f) == [] for f in data_functions)
    (report,) = amp.reports
    assert report.changed  # the MatMul outside the pipeline still turned bfloat16


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
