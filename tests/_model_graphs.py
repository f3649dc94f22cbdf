"""Real training-step graphs for the differential tests and the speed benchmark.

Each builder returns a ``ModelGraph``: the GraphDef (with its function library), the node names
a session would fetch (preserved by both rewrites), and, where the graph can run on its own,
the feed name and shape. Sizes are kept small: the graphs exercise structure, not FLOPs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2


@dataclass
class ModelGraph:
    name: str
    graph_def: graph_pb2.GraphDef
    fetches: list[str]
    feeds: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _train_step_graph(
    name: str, model: tf.keras.Model, x_shape: tuple[int, ...], y_fn: Callable[[], tf.Tensor],
    x_dtype: tf.DType = tf.float32,
) -> ModelGraph:
    import keras

    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    y = y_fn()
    spec_x = tf.TensorSpec(x_shape, x_dtype)
    concrete = step.get_concrete_function(spec_x, tf.TensorSpec.from_tensor(y))
    graph_def = concrete.graph.as_graph_def()
    fetches = [t.op.name for t in concrete.outputs]
    return ModelGraph(name, graph_def, fetches)


def keras_cnn() -> ModelGraph:
    """Conv2D + BatchNorm + pooling + Dense classifier, one SGD-momentum step."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    return _train_step_graph("keras_cnn", model, (4, 16, 16, 3), lambda: tf.zeros([4], tf.int32))


def keras_mobilenet() -> ModelGraph:
    """keras.applications.MobileNetV2 (weights=None): depthwise convs, BN, ReLU6, dropout."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10,
        classifier_activation=None,
    )
    return _train_step_graph(
        "mobilenet_v2", model, (2, 32, 32, 3), lambda: tf.zeros([2], tf.int32)
    )


def keras_transformer() -> ModelGraph:
    """One Transformer encoder block: MultiHeadAttention, LayerNorm, GELU MLP, residuals."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 32))
    h = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(inputs, inputs)
    h = keras.layers.LayerNormalization()(inputs + h)
    m = keras.layers.Dense(64, activation="gelu")(h)
    m = keras.layers.Dense(32)(m)
    h = keras.layers.LayerNormalization()(h + m)
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(inputs, logits)
    return _train_step_graph("transformer", model, (2, 8, 32), lambda: tf.zeros([2], tf.int32))


def keras_embedding_encoder() -> ModelGraph:
    """Token Embedding into attention, and a learned position table whose first rows (a Slice)
    go through a Dense: lookups of weight tables straight into allow-list ops, which
    TensorFlow's pass paints half by casting each whole table."""
    import keras

    class PositionTable(keras.layers.Layer):
        def build(self, input_shape: tuple[int, ...]) -> None:
            self.table = self.add_weight(shape=(32, input_shape[-1]), name="positions")

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return tf.slice(self.table, [0, 0], [tf.shape(x)[1], -1])

    keras.utils.set_random_seed(0)
    tokens = keras.Input((8,), dtype="int32")
    e = keras.layers.Embedding(200, 16)(tokens)
    h = keras.layers.LayerNormalization()(e + keras.layers.MultiHeadAttention(2, 8)(e, e))
    h = h + keras.layers.Dense(16)(PositionTable()(h))
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    return _train_step_graph("embedding_encoder", keras.Model(tokens, logits), (2, 8),
                             lambda: tf.zeros([2], tf.int32), x_dtype=tf.int32)


def keras_lstm_gru() -> ModelGraph:
    """Stacked LSTM + GRU (no cuDNN on CPU: While loops with TensorLists, in functions)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 8)),
            keras.layers.LSTM(16, return_sequences=True),
            keras.layers.GRU(16),
            keras.layers.Dense(10),
        ]
    )
    return _train_step_graph("lstm_gru", model, (2, 6, 8), lambda: tf.zeros([2], tf.int32))


def einsum_attention() -> ModelGraph:
    """Multi-head self-attention written with ``tf.einsum`` (Einsum projections, scores and
    weighted sum; softmax; output projection), a residual, LayerNorm and a Dense head."""
    import keras

    keras.utils.set_random_seed(0)

    class EinsumSelfAttention(keras.layers.Layer):
        def __init__(self, heads: int, key_dim: int) -> None:
            super().__init__()
            self.heads, self.key_dim = heads, key_dim

        def build(self, input_shape: tuple[int, ...]) -> None:
            d = input_shape[-1]
            shape = (d, self.heads, self.key_dim)
            self.wq = self.add_weight(shape=shape, initializer="glorot_uniform", name="wq")
            self.wk = self.add_weight(shape=shape, initializer="glorot_uniform", name="wk")
            self.wv = self.add_weight(shape=shape, initializer="glorot_uniform", name="wv")
            self.wo = self.add_weight(
                shape=(self.heads, self.key_dim, d), initializer="glorot_uniform", name="wo"
            )

        def call(self, x: tf.Tensor) -> tf.Tensor:
            q = tf.einsum("btd,dhk->bthk", x, self.wq)
            k = tf.einsum("btd,dhk->bthk", x, self.wk)
            v = tf.einsum("btd,dhk->bthk", x, self.wv)
            scores = tf.einsum("bqhk,bshk->bhqs", q, k) * (self.key_dim**-0.5)
            weights = tf.nn.softmax(scores, axis=-1)
            context = tf.einsum("bhqs,bshk->bqhk", weights, v)
            return tf.einsum("bqhk,hkd->bqd", context, self.wo)

    inputs = keras.Input((8, 32))
    h = keras.layers.LayerNormalization()(inputs + EinsumSelfAttention(4, 8)(inputs))
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(inputs, logits)
    return _train_step_graph(
        "einsum_attention", model, (2, 8, 32), lambda: tf.zeros([2], tf.int32)
    )


@contextlib.contextmanager
def v1_control_flow() -> Iterator[None]:
    """Build with TF1 control flow (Switch/Merge/Enter/Exit/NextIteration) temporarily."""
    from tensorflow.python.ops import control_flow_util

    old = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = old


def tf1_while_momentum() -> ModelGraph:
    """TF1 graph: v1 while loop over a matmul RNN, resource variables, Momentum optimizer."""
    graph = tf.Graph()
    with graph.as_default(), v1_control_flow():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [8, 16], name="x")
        init = v1.constant_initializer(np.linspace(-0.2, 0.2, 256).reshape(16, 16))
        w = v1.get_variable("w", [16, 16], initializer=init, use_resource=True)
        b = v1.get_variable("b", [16], initializer=v1.zeros_initializer(), use_resource=True)

        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.tanh(tf.matmul(h, w) + b)

        _, h = v1.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
        logits = tf.matmul(h, w, name="logits")
        loss = tf.reduce_mean(tf.square(logits), name="loss")
        train = v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, name="train")
        v1.global_variables_initializer()
    return ModelGraph(
        "tf1_while_momentum",
        graph.as_graph_def(),
        [train.name, "loss", "init"],
        feeds={"x": (8, 16)},
    )


ALL_BUILDERS: dict[str, Callable[[], ModelGraph]] = {
    "keras_cnn": keras_cnn,
    "mobilenet_v2": keras_mobilenet,
    "transformer": keras_transformer,
    "embedding_encoder": keras_embedding_encoder,
    "lstm_gru": keras_lstm_gru,
    "tf1_while_momentum": tf1_while_momentum,
    "einsum_attention": einsum_attention,
}


def inline_functions(model: ModelGraph) -> ModelGraph:
    """The same graph after Grappler's function inlining (what the tf.function runtime adapter
    does): calls inlined, functional While/If lowered to Switch/Merge/Enter/Exit loops."""
    from tensorflow.python.grappler import tf_optimizer

    from tf_amp.runtime._graphdef import grappler_request

    # Not _graphdef.inline_library: that skips graphs without calls, and the point here is
    # the lowering of functional While/If, which Grappler does while inlining.
    inlined = tf_optimizer.OptimizeGraph(
        *grappler_request(model.graph_def, model.fetches, ["function"])
    )
    return ModelGraph(model.name + "_inlined", inlined, list(model.fetches), dict(model.feeds))


ALL_BUILDERS["lstm_gru_inlined"] = lambda: inline_functions(keras_lstm_gru())
