"""Rewritten real-model graphs import and run, and match float32 within float16 tolerance.

Keras models are frozen (variables -> Consts) so the graph runs on its own in a Session;
the LSTM/GRU model keeps its While loops and their body functions, so function rewriting is
checked numerically too. The training-step graphs of the differential tests are imported
(TensorFlow validates every edge's dtype on import).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import convert_to_constants

import tf_amp
from tests import _model_graphs
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def


def frozen_forward(model: tf.keras.Model, shape: tuple[int, ...]) -> tuple[graph_pb2.GraphDef,
                                                                           str, str]:
    fn = tf.function(lambda x: model(x, training=False))
    concrete = fn.get_concrete_function(tf.TensorSpec(shape, tf.float32))
    frozen = convert_to_constants.convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def(), frozen.inputs[0].name, frozen.outputs[0].name


def run(gd: graph_pb2.GraphDef, feed: str, fetch: str, x: np.ndarray) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(fetch, {feed: x})


def cnn() -> tf.keras.Model:
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.DepthwiseConv2D(3, padding="same"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def transformer() -> tf.keras.Model:
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 32))
    h = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(inputs, inputs)
    h = keras.layers.LayerNormalization()(inputs + h)
    h = keras.layers.Dense(32, activation="gelu")(h)
    return keras.Model(inputs, keras.layers.Dense(4)(h))


def recurrent() -> tf.keras.Model:
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((6, 8)),
        keras.layers.LSTM(16, return_sequences=True),
        keras.layers.GRU(16),
        keras.layers.Dense(4),
    ])


@pytest.mark.parametrize(
    ("builder", "shape"),
    [(cnn, (2, 16, 16, 3)), (transformer, (2, 8, 32)), (recurrent, (2, 6, 8))],
)
def test_frozen_model_matches_float32(builder, shape) -> None:  # noqa: ANN001
    gd, feed, fetch = frozen_forward(builder(), shape)
    result = rewrite_graph_def(gd, RewriteConfig(preserve_nodes={fetch.split(":")[0]}))
    assert result.report.type_attrs_converted > 0
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = run(gd, feed, fetch, x)
    got = run(result.graph_def, feed, fetch, x)
    assert got.dtype == np.float32
    scale = np.abs(want).max() + 1e-6
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-2)


@pytest.mark.parametrize("name", ["keras_cnn", "transformer", "lstm_gru", "lstm_gru_inlined"])
def test_training_step_graphs_import(name: str) -> None:
    model = _model_graphs.ALL_BUILDERS[name]()
    result = rewrite_graph_def(model.graph_def,
                               RewriteConfig(preserve_nodes=frozenset(model.fetches)))
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(result.graph_def, name="")  # dtype-checks every edge
    assert result.report.casts_to_half > 0


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_a_constant_beyond_the_targets_range_is_folded_to_a_finite_sentinel(target) -> None:
    # -1e9 (Keras's attention mask) became -inf in float16; infinities and NaNs stay.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
        h = tf.matmul(x, tf.ones((4, 4)), name="mm")
        big = tf.constant([-1e9, 1e9, -np.inf, 3.0], name="big")
        tf.identity(tf.nn.softmax(tf.where(h > 0, h, big)), name="out")
    result = rewrite_graph_def(graph.as_graph_def(), RewriteConfig(
        target_dtype=target, preserve_nodes=frozenset({"x", "out"})))
    (node,) = [n for n in result.graph_def.node if n.name == "big"]
    value = tf.make_ndarray(node.attr["value"].tensor).astype(np.float32)
    largest = {"float16": 65504.0, "bfloat16": 1e9}[target]  # 1e9 fits in bfloat16
    if node.attr["dtype"].type == tf.as_dtype(target).as_datatype_enum:
        np.testing.assert_allclose(value[:2], [-largest, largest], rtol=1e-2)
        assert value[2] == -np.inf and value[3] == 3.0
    else:
        pytest.fail(f"'big' was not folded to {target}: the test no longer tests folding")


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_a_constant_float32_ops_also_read_reaches_half_ops_clipped_not_infinite(target) -> None:
    # The Const cannot turn half in place (a float32 op reads it), so its half readers used
    # to get a runtime Cast: -3.4e38 (beyond bfloat16's largest finite too) became -inf and
    # the masked row NaN.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
        h = tf.matmul(x, tf.ones((4, 4)), name="mm")
        big = tf.constant([-3.4e38] * 4, name="big")
        masked = tf.nn.softmax(tf.where(h > 1e9, h, big), name="masked")
        tf.identity(masked, name="out")
        tf.identity(tf.reduce_sum(big / 3.4e38), name="float32_reader")
    result = rewrite_graph_def(graph.as_graph_def(), RewriteConfig(
        target_dtype=target, preserve_nodes=frozenset({"x", "out", "float32_reader"})))
    after = {n.name: n for n in result.graph_def.node}
    assert after["big"].attr["dtype"].type == tf.float32.as_datatype_enum
    select = [n for n in after.values() if n.op == "SelectV2"]
    assert select and select[0].attr["T"].type == tf.as_dtype(target).as_datatype_enum
    with tf.compat.v1.Session(graph=_imported(result.graph_def)) as sess:
        out, reader = sess.run(["out:0", "float32_reader:0"], {"x:0": np.ones((2, 4))})
    np.testing.assert_allclose(out, np.full((2, 4), 0.25), rtol=1e-2)
    np.testing.assert_allclose(reader, -4.0, rtol=1e-6)


def test_a_folded_additive_mask_leaves_room_for_the_logits_it_is_added_to() -> None:
    # Clipped to -65504, -1e9 plus a logit below -16 summed to float16 -inf, and a fully
    # masked row of negative logits was NaN where float32 gives a uniform row.
    mask = np.zeros((4, 4), np.float32)
    mask[0, :], mask[1:, 3] = -1e9, -1e9  # row 0 fully masked
    q = np.ones((4, 8), np.float32)
    q[0] = -1.0  # row 0's logits: -24
    k = np.full((8, 4), 3.0, np.float32)

    def attention(q: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(tf.matmul(q, k) + tf.constant(mask))

    want = tf.function(attention)(q, k).numpy()
    amp = tf_amp.function(attention, config=RewriteConfig(target_dtype="float16"))
    got = amp(q, k).numpy()
    assert amp.reports[-1].consts_folded >= 1  # the mask was folded, not cast
    np.testing.assert_allclose(got, want, atol=1e-3)
    np.testing.assert_allclose(got[0], 0.25)


def test_a_folded_bound_beyond_range_keeps_the_whole_range() -> None:
    # A sentinel used as a bound, not added: clipped to half the range, it cut every value
    # between 32752 and 65504 (the sum below came out 131008, not 160000).
    x = np.full((4, 8), 100.0, np.float32)
    w = np.full((8, 4), 50.0, np.float32)  # every product: 40000

    def bounded(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.minimum(tf.matmul(x, w), tf.constant(1e5)))

    amp = tf_amp.function(bounded, config=RewriteConfig(target_dtype="float16"))
    assert float(amp(x, w)) == float(tf.function(bounded)(x, w)) == 640000.0
    assert amp.reports[-1].consts_folded >= 1


def test_a_constant_that_rounds_to_the_largest_half_is_no_sentinel() -> None:
    # 65510 rounds to float16's 65504 as a Cast rounds it; taken for a value beyond the range
    # (above 65504), it became the sentinel 32752 where a sum read it: half its value.
    w = tf.constant(np.eye(4, dtype=np.float32))

    def shifted(x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.matmul(x, w) + 65510.0, w)

    x = tf.constant([[1.0, 2.0, 3.0, 4.0]])
    amp = tf_amp.function(shifted, config=RewriteConfig(target_dtype="float16"))
    np.testing.assert_allclose(amp(x), tf.function(shifted)(x), rtol=1e-3)


def test_a_product_by_a_constant_beyond_range_stays_float32() -> None:
    """A constant beyond float16's range that scales a value is no sentinel: clipped to
    65504, ``h * 1e5`` came out 1.53x too small with nothing to tell (TensorFlow's pass and
    Keras's policy give inf); ``h / 1e-5`` became a product by 1e5 in Grappler, infinite.
    Kept float32, both are right; the sum beside them still folds its sentinel, and a
    sentinel spread by ``tf.fill`` for a select stays one (kept float32 at first, the fill
    was cast to -inf at run time and the fully masked row was NaN)."""
    x = tf.constant([[1e-3, 2e-3], [-3e-3, 5e-4]])
    w = tf.constant([[1.0, 0.5], [0.25, -1.0]])

    def scaled(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, ...]:
        h = tf.matmul(x, w)
        masked = tf.where(tf.constant([[True, False], [False, False]]), h,
                          tf.fill(tf.shape(h), -1e9))  # a spread sentinel: its select decides
        return (h * 1e5, h / 1e-5, tf.nn.softmax(h + tf.constant([-1e9, 0.0])),
                tf.nn.softmax(masked))

    want = tf.function(scaled)(x, w)
    amp = tf_amp.function(scaled, config=RewriteConfig(target_dtype="float16"))
    for got, expected in zip(amp(x, w), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=2e-3, atol=1e-3)
    (report,) = amp.reports
    kept = {d.op for d in report.decisions if "beyond the target's range" in d.reason}
    assert kept == {"Mul", "RealDiv"}
    assert report.consts_folded >= 1


def _imported(graph_def: graph_pb2.GraphDef) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph
