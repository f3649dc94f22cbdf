"""Training steps that capture an eager tensor created outside the function.

``tf.function`` captures a small eager tensor (up to 128 elements) as a ``Const`` node that is
still one of the graph's inputs, fed with the captured value on every call; a larger one as a
``Placeholder``. The rebuilt function feeds both through its own inputs, so the rewrite must not
fold the ``Const`` to float16 (the importer then rejects the float32 feed into half consumers).
Each case checks that the step runs, that its executed graph holds float16 MatMuls, and that the
loss and the updated weights match a float32 twin within float16 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.e2e_helpers import half_ops_of_functions
from tf_amp.config import RewriteConfig
from tf_amp.runtime import activation
from tf_amp.runtime.settings import Settings

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (rows of the captured batch, how tf.function captures it)
CAPTURES = [pytest.param(4, "Const", id="const"), pytest.param(64, "Placeholder", id="placeholder")]


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )


def _captured_batch(rows: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(1).random((rows, 8), dtype=np.float32))


def _step_body(model: keras.Model, opt: keras.optimizers.Optimizer, x: tf.Tensor) -> Callable:
    """The brief's step: ``x`` is captured, only the loss factor is an argument."""

    def step(factor: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2) * factor
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step


def _float32_reference(rows: int, capture_op: str) -> tuple[list[float], list[np.ndarray]]:
    model, x = _model(), _captured_batch(rows)
    step = tf.function(_step_body(model, keras.optimizers.SGD(0.1), x))
    concrete = step.get_concrete_function(tf.constant(1.0))
    assert [internal.op.type for _, internal in concrete.graph.captures].count(capture_op) >= 1
    losses = [float(step(tf.constant(1.0))) for _ in range(3)]
    return losses, [v.numpy() for v in model.trainable_variables]


def _assert_matches_float32(
    losses: list[float], model: keras.Model, reference: tuple[list[float], list[np.ndarray]]
) -> None:
    ref_losses, ref_weights = reference
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-3)
    for got, want in zip(model.trainable_variables, ref_weights, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=5e-3, atol=1e-3)
    assert losses != ref_losses  # float16 rounding shows: half precision really ran


@pytest.mark.parametrize(("rows", "capture_op"), CAPTURES)
def test_tf_amp_function_step_with_a_captured_eager_tensor(rows: int, capture_op: str) -> None:
    reference = _float32_reference(rows, capture_op)
    model, x = _model(), _captured_batch(rows)
    config = RewriteConfig.from_env(target_dtype="float16")
    step = tf_amp.function(_step_body(model, keras.optimizers.SGD(0.1), x), config=config)

    losses = [float(step(tf.constant(1.0))) for _ in range(3)]

    assert "MatMul" in half_ops_of_functions(step.rewritten_concrete_functions())
    _assert_matches_float32(losses, model, reference)


@pytest.mark.parametrize(("rows", "capture_op"), CAPTURES)
def test_env_activated_tf_function_step_with_a_captured_eager_tensor(
    rows: int, capture_op: str
) -> None:
    """The ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` path: a plain ``tf.function``, rewritten."""
    reference = _float32_reference(rows, capture_op)
    with activation.activated(Settings(graph_rewrite=True, loss_scaling=False)):
        model, x = _model(), _captured_batch(rows)
        step = tf.function(_step_body(model, keras.optimizers.SGD(0.1), x))
        losses = [float(step(tf.constant(1.0))) for _ in range(3)]
        concretes = step.rewritten_concrete_functions()

    assert "MatMul" in half_ops_of_functions(concretes)
    _assert_matches_float32(losses, model, reference)


def test_tape_outside_reaches_a_captured_constant() -> None:
    """The capture stays an input of the rebuilt function (fed, not folded into the graph), so
    a tape outside the function still differentiates with respect to it."""
    x = tf.constant(np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8))
    w = tf.Variable(tf.ones((8, 4)))
    forward = tf_amp.function(lambda: tf.matmul(x, w))
    with tf.GradientTape() as tape:
        tape.watch(x)
        product = forward()
        total = tf.reduce_sum(product)
    grad: Any = tape.gradient(total, x)

    assert product.dtype == tf.float32
    np.testing.assert_allclose(product.numpy(), x.numpy() @ np.ones((8, 4)), rtol=1e-3)
    np.testing.assert_allclose(grad.numpy(), 4.0)
    assert "MatMul" in half_ops_of_functions(forward.rewritten_concrete_functions())


def test_env_activated_tf_keras_step_with_a_captured_eager_constant() -> None:
    """The same step on a tf_keras (Keras 2) model and optimizer under the activation."""
    tf_keras = pytest.importorskip("tf_keras")

    def run() -> tuple[list[float], list[np.ndarray], Any]:
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.Sequential(
            [tf_keras.layers.Dense(16, "relu", input_shape=(8,)), tf_keras.layers.Dense(1)]
        )
        step = tf.function(_step_body(model, tf_keras.optimizers.SGD(0.1), _captured_batch(4)))
        losses = [float(step(tf.constant(1.0))) for _ in range(3)]
        return losses, [v.numpy() for v in model.trainable_variables], step

    ref_losses, ref_weights, _ = run()
    with activation.activated(Settings(graph_rewrite=True, loss_scaling=False)):
        losses, weights, step = run()
        concretes = step.rewritten_concrete_functions()

    assert "MatMul" in half_ops_of_functions(concretes)
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-3)
    for got, want in zip(weights, ref_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=1e-3)
    assert losses != ref_losses
