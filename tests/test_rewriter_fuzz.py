"""Robustness: randomly damaged GraphDefs get a clear error or a graph that still imports.

The spec tests cover each kind of malformed input once (tests/test_rewriter_graphs.py); here a
seeded random mutator breaks real graphs in combinations nobody writes by hand: inputs that
name no node, a missing port or an out-of-range one, FunctionDef references with a wrong output
arg, extra or missing inputs, unknown or swapped ops, removed or retyped attrs, bad list lengths,
duplicate or odd names, deleted nodes, broken ``ret`` entries. Every case must end in one of:

- ``GraphRewriteError`` (a ``ValueError`` whose message names the problem), or
- a result, and then, when TensorFlow imports the damaged input, it imports the output too.

In every case the caller's GraphDef is left byte for byte as it was. (A graph TensorFlow itself
rejects may come back rewritten: the rewrite does not promise to validate what TensorFlow
validates, only never to turn an importable graph into a broken one.)
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tests import _model_graphs
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import GraphRewriteError, rewrite_graph_def

v1 = tf.compat.v1


def _multi_type_op_graph() -> graph_pb2.GraphDef:
    """TF1, gradients through the ops with several type attrs (IdentityN, a Cast pair) and
    ops of every list, which the differential suite's graphs (``_model_graphs``) hold few of."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [4, 4], name="x")
        w = v1.get_variable("w", [4, 4], initializer=tf.ones_initializer(), use_resource=True)
        h = tf.nn.relu(tf.matmul(x, w) + 1.0)
        a, b = tf.identity_n([h, tf.exp(h)])
        mean, _ = tf.nn.moments(a, [0])
        c = tf.cast(tf.cast(b, tf.int32), tf.float32)
        s = tf.concat([a, c], 0)
        loss = tf.identity(tf.reduce_sum(s * tf.tanh(s)) + tf.reduce_sum(mean), name="loss")
        tf.gradients(loss, [w])
    return graph.as_graph_def()


def _tf2_while_graph() -> graph_pb2.GraphDef:
    """A traced function with a functional While: a library with cond and body FunctionDefs,
    a few nodes each (``_model_graphs.keras_lstm_gru`` has them too, but thousands of nodes
    would leave most damage in the plain graph around them)."""

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.nn.relu(tf.matmul(h, h) * 0.1)

        _, h = tf.while_loop(lambda i, h: i < 3, body, [0, x])
        return tf.reduce_sum(tf.exp(h))

    spec = tf.TensorSpec([4, 4], tf.float32)
    return step.get_concrete_function(spec).graph.as_graph_def()


def _damage_node_list(nodes: Any, rng: random.Random) -> None:
    """One random mutation of one node of ``nodes`` (GraphDef.node or FunctionDef.node_def)."""
    names = [n.name for n in nodes]
    index = rng.randrange(len(names))
    node = nodes[index]
    attr_keys = sorted(node.attr)
    kind = rng.randrange(13)
    if kind == 0 and node.input:
        other = rng.choice(names)
        node.input[rng.randrange(len(node.input))] = rng.choice(
            ["nowhere", "x:9", "x:-1", "x:abc", "", ":", "^nowhere", f"{other}:3",
             f"{other}:output:{rng.randrange(3)}", f"{other}:z:0", f"{other}:1"]
        )
    elif kind == 1 and node.input:
        del node.input[rng.randrange(len(node.input))]
    elif kind == 2:
        node.input.append(rng.choice(names) + rng.choice(["", ":1", ":0"]))
    elif kind == 3:
        node.op = rng.choice(["NoSuchOp", "Relu", "MatMul", "Cast", "IdentityN", "", "Const"])
    elif kind == 4 and attr_keys:
        del node.attr[rng.choice(attr_keys)]
    elif kind == 5 and attr_keys:
        node.attr[rng.choice(attr_keys)].type = rng.choice(
            [types_pb2.DT_INT32, types_pb2.DT_HALF, types_pb2.DT_FLOAT, 0, 999]
        )
    elif kind == 6 and attr_keys:
        node.attr[rng.choice(attr_keys)].list.type.extend([types_pb2.DT_FLOAT, types_pb2.DT_INT32])
    elif kind == 7:
        nodes.add().CopyFrom(node)
    elif kind == 8:
        node.name = rng.choice(["", "x", "a:b", "^c", node.name + "/z"])
    elif kind == 9 and attr_keys:
        node.attr[rng.choice(attr_keys)].s = b"junk"
    elif kind == 10 and attr_keys:
        node.attr[rng.choice(attr_keys)].i = rng.choice([-1, 0, 10**6])
    elif kind == 11:
        node.attr["N"].i = rng.choice([-3, 0, 7])
    elif kind == 12:
        del nodes[index]


def _damage(graph_def: graph_pb2.GraphDef, rng: random.Random) -> None:
    functions = graph_def.library.function
    if functions and rng.random() < 0.6:
        fdef = rng.choice(functions)
        if fdef.ret and rng.random() < 0.15:
            key = rng.choice(sorted(fdef.ret))
            fdef.ret[key] = rng.choice(["nowhere:y:0", "x", "a:b:c:d", "", fdef.ret[key] + "0"])
        elif fdef.node_def:
            _damage_node_list(fdef.node_def, rng)
        return
    if graph_def.node:
        _damage_node_list(graph_def.node, rng)


def _imports(graph_def: graph_pb2.GraphDef) -> bool:
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)  # import_graph_def may add default attrs to what it is given
    try:
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(copy, name="")
    except (ValueError, TypeError, tf.errors.OpError):
        return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_damaged_graphs_give_a_clear_error_or_an_importable_graph(seed: int) -> None:
    rng = random.Random(seed)
    # (graph, fetches to preserve, as a session would fetch them). The TF1 while loop with a
    # Momentum step (Switch/Merge/Enter/Exit/NextIteration) is the differential suite's own.
    v1_loop = _model_graphs.tf1_while_momentum()
    bases = [
        (_multi_type_op_graph(), ["loss"]),
        (_tf2_while_graph(), ["Identity"]),
        (v1_loop.graph_def, v1_loop.fetches),
    ]
    outcomes = {"error": 0, "imports": 0, "input rejected by TensorFlow": 0}
    for case in range(200):
        damaged = graph_pb2.GraphDef()
        base, fetches = rng.choice(bases)
        damaged.CopyFrom(base)
        for _ in range(rng.randrange(1, 4)):
            _damage(damaged, rng)
        before = damaged.SerializeToString(deterministic=True)
        config = RewriteConfig(
            preserve_nodes=frozenset(fetches),
            opt_level=rng.choice(["O1", "O2", "O3"]),
            preserve_names=rng.random() < 0.3,
        )
        try:
            result = rewrite_graph_def(damaged, config)
        except GraphRewriteError as err:
            assert str(err), f"case {case}: an error without a message"
            outcomes["error"] += 1
            continue
        finally:
            assert damaged.SerializeToString(deterministic=True) == before, (
                f"case {case}: the rewrite changed its input"
            )
        if _imports(damaged):
            assert _imports(result.graph_def), (
                f"case {case}: TensorFlow imports the input but not the rewritten graph"
            )
            outcomes["imports"] += 1
        else:
            outcomes["input rejected by TensorFlow"] += 1
    # The mutator must exercise both outcomes, or this test checks less than it claims.
    assert outcomes["error"] > 20 and outcomes["imports"] > 15, outcomes
