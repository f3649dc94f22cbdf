"""tf_amp's casts never give a tensor more readers than it had, and float32 readers share one.

Why it matters: with oneDNN (the default on x86 Linux), TensorFlow's Grappler logs "remapper
failed: ... fanout 'R' exist for missing node '.../BiasAdd'" when a Conv2D/MatMul + BiasAdd
feeding a LeakyRelu has a second reader R. It happens without tf_amp (in Keras training the
LeakyReluGrad is that reader); after a rewrite R can be a tf_amp cast
(``...-CastToFp32-tf_amp``) standing where a float32 reader was. These tests pin down that the
rewrite cannot create that condition: it never adds a reader to a tensor (a cast replaces the
edges it serves), and the float32 readers of one tensor share one cast. README, Known
limitations, has the measurements; ``scripts/remapper_leaky_relu.py`` reproduces them.
"""

from __future__ import annotations

from collections import Counter

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tests import _model_graphs
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def

v1 = tf.compat.v1


def readers(graph_def: graph_pb2.GraphDef) -> Counter:
    """(producer, output port) -> number of data (non-control) inputs reading it."""
    count: Counter = Counter()
    for node in graph_def.node:
        for name in node.input:
            if name.startswith("^"):
                continue
            producer, _, port = name.partition(":")
            count[(producer, int(port or 0))] += 1
    return count


def conv_bias_leaky_relu_with_float32_readers() -> graph_pb2.GraphDef:
    """The remapper's failing pattern, the BiasAdd also read by three float32-only (deny) ops."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        w = tf.constant(0.1, tf.float32, [3, 3, 3, 8])
        b = tf.constant(0.2, tf.float32, [8])
        y = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b, name="bias_add")
        act = tf.nn.leaky_relu(y, name="leaky")
        extra = [tf.exp(y, name="exp"), tf.math.expm1(y, name="expm1"), tf.pow(y, 2.0, name="pow")]
        tf.identity(tf.reduce_sum(act) + tf.add_n([tf.reduce_sum(e) for e in extra]), name="out")
    return graph.as_graph_def()


def keras_cnn_inlined() -> graph_pb2.GraphDef:
    return _model_graphs.inline_functions(_model_graphs.keras_cnn()).graph_def


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
@pytest.mark.parametrize("build", [conv_bias_leaky_relu_with_float32_readers, keras_cnn_inlined])
def test_no_tensor_gets_more_readers(build, target: str) -> None:  # noqa: ANN001 - a builder
    before = build()
    after = rewrite_graph_def(before, RewriteConfig(target_dtype=target, check_kernels=False,
                                                    preserve_nodes={"out"})).graph_def
    casts = [n for n in after.node if n.name.endswith("-tf_amp")]
    assert casts, "the rewrite inserted no cast: the property would hold trivially"
    counted_before, counted_after = readers(before), readers(after)
    grown = {key: (counted_before[key], counted_after[key])
             for key in counted_before if counted_after[key] > counted_before[key]}
    assert not grown, grown


def test_float32_readers_of_the_bias_add_share_one_cast() -> None:
    gd = conv_bias_leaky_relu_with_float32_readers()
    after = rewrite_graph_def(gd, RewriteConfig(target_dtype="bfloat16", check_kernels=False,
                                                preserve_nodes={"out"})).graph_def
    by_name = {n.name: n for n in after.node}
    assert by_name["bias_add"].attr["T"].type == tf.bfloat16.as_datatype_enum
    # Before: leaky and three float32 readers. After: leaky (bf16) and one cast to float32
    # serving exp, expm1 and pow -- not one cast per reader.
    casts_of_bias_add = [n for n in after.node
                         if n.op == "Cast" and n.input and n.input[0] == "bias_add"]
    assert len(casts_of_bias_add) == 1, [n.name for n in casts_of_bias_add]
    assert readers(after)[("bias_add", 0)] == 2
