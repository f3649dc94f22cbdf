"""Property tests: random graphs of list / no-list ops always rewrite into graphs that import
(TensorFlow dtype-checks every edge), run, match float32, and are fixed points of the rewrite.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import graph_pb2

from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def

v1 = tf.compat.v1

# name -> (arity, builder); every op maps [3, 3] float32 tensors to [3, 3]
OPS = {
    "matmul": (2, lambda a, b: tf.matmul(a, b) * 0.3),  # allow (+ infer Mul)
    "add": (2, tf.add),  # infer
    "relu": (1, tf.nn.relu),  # clear
    "tanh": (1, tf.tanh),  # infer
    "exp": (1, lambda a: tf.exp(tf.clip_by_value(a, -2.0, 2.0))),  # deny (+ clear)
    "atan": (1, tf.atan),  # on no list
    "identity_n": (2, lambda a, b: tf.identity_n([a, b])[1]),  # list(type) attr
    "cast_roundtrip": (1, lambda a: tf.cast(tf.cast(a, tf.int32), tf.float32)),  # Cast
    "reduce": (1, lambda a: a - tf.reduce_mean(a, axis=1, keepdims=True)),  # deny Mean
}

graph_specs = st.lists(
    st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 50), st.integers(0, 50)),
    min_size=1,
    max_size=10,
)


def build(spec: list[tuple[str, int, int]]) -> tuple[graph_pb2.GraphDef, str]:
    graph = tf.Graph()
    with graph.as_default():
        tensors = [v1.placeholder(tf.float32, [3, 3], name="x")]
        for op, i, j in spec:
            arity, fn = OPS[op]
            args = [tensors[i % len(tensors)], tensors[j % len(tensors)]][:arity]
            tensors.append(fn(*args))
        out = tf.identity(tf.add_n(tensors[1:]), name="out")
    return graph.as_graph_def(), out.op.name


def run(gd: graph_pb2.GraphDef, x: np.ndarray) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with v1.Session(graph=graph) as sess:
        return sess.run("out:0", {"x:0": x})


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(spec=graph_specs, preserve_names=st.booleans(), level=st.sampled_from(["O1", "O2", "O3"]))
def test_random_graphs_stay_valid_and_close(spec, preserve_names: bool, level: str) -> None:  # noqa: ANN001
    gd, fetch = build(spec)
    cfg = RewriteConfig(preserve_nodes={fetch}, preserve_names=preserve_names, opt_level=level)
    result = rewrite_graph_def(gd, cfg)
    x = np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)
    want = run(gd, x)
    got = run(result.graph_def, x)  # imports: every edge's dtype is consistent
    scale = float(np.abs(want).max()) + 1.0
    # float16 keeps ~3 significant digits; Cast-to-int rounding may flip by 1 near .5
    assert np.abs(got - want).max() / scale < 0.6
    again = rewrite_graph_def(result.graph_def, cfg)
    assert again.report.type_attrs_converted == 0
    assert again.graph_def == result.graph_def
