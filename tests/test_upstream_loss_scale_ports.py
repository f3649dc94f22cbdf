"""The behavioural scenarios of the upstream loss-scale suites, in our words, on tf_amp's API.

Sources (read, not copied): Keras 3 ``keras/src/optimizers/loss_scale_optimizer_test.py`` and
tf-keras ``tf_keras/mixed_precision/loss_scale_optimizer_test.py``. Their MirroredStrategy
scenarios are in ``tests/test_migration_distribute.py``. Where tf_amp differs on purpose the
test says so and asserts tf_amp's behaviour (README, "Coming from Keras / tf.keras / TF1").
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp


def sgd_lso(lr: float = 0.5, **kwargs):
    return tf_amp.LossScaleOptimizer(keras.optimizers.SGD(lr), **kwargs)


def apply_pre_scaled(opt, grads, var) -> None:
    """Keras 3's tests apply gradients that are already multiplied by the scale, without a
    scale_loss call the wrapper can see: tf_amp warns (see README) and divides, as Keras."""
    with pytest.warns(UserWarning, match="not scaled"):
        opt.apply(grads, [var])


# ---------------------------------------------------------------------------- Keras 3
def test_keras_finite_step_applies_the_unscaled_gradient():
    opt = sgd_lso()
    var = tf.Variable([1.0, 2.0, 3.0, 4.0])
    apply_pre_scaled(opt, [tf.constant([1.0, 6.0, 7.0, 2.0]) * opt.initial_scale], var)
    np.testing.assert_allclose(var.numpy(), [0.5, -1.0, -0.5, 3.0], rtol=1e-6)


def test_keras_infinite_step_leaves_the_variable():
    opt = sgd_lso()
    var = tf.Variable([1.0, 2.0, 3.0, 4.0])
    apply_pre_scaled(opt, [tf.constant([np.inf] * 4)], var)
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_keras_downscaling_halves_per_skip():
    opt = sgd_lso(initial_scale=400.0)
    var = tf.Variable([1.0, 2.0, 3.0, 4.0])
    for _ in range(4):
        apply_pre_scaled(opt, [tf.constant([np.inf] * 4)], var)
    assert float(opt.scale_loss(tf.constant(1.0))) == 25.0


def test_keras_upscaling_doubles_every_growth_steps():
    opt = sgd_lso(initial_scale=2.0, dynamic_growth_steps=2)
    var = tf.Variable([1.0, 2.0, 3.0, 4.0])
    for _ in range(8):
        apply_pre_scaled(opt, [tf.constant([1.0, 6.0, 7.0, 2.0])], var)
    assert float(opt.scale_loss(tf.constant(1.0))) == 32.0


def test_keras_config_round_trip():
    inner = keras.optimizers.SGD(0.5, momentum=0.06, nesterov=True, weight_decay=0.004)
    opt = tf_amp.LossScaleOptimizer(inner)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert again.get_config() == opt.get_config()
    assert again.inner_optimizer.get_config() == inner.get_config()


# --------------------------------------------------------------------------- tf-keras
def test_tf_keras_is_instance():
    assert isinstance(sgd_lso(), tf_amp.LossScaleOptimizer)


def test_tf_keras_dynamic_attributes_of_a_fixed_scale():
    opt = sgd_lso(dynamic=False, initial_scale=2.0)
    assert opt.dynamic is False and opt.dynamic_counter is None
    assert opt.dynamic_growth_steps is None


def test_tf_keras_get_scaled_loss_of_tensors_and_callables():
    opt = sgd_lso(dynamic=False, initial_scale=2.0)
    for dtype in ("float32", "float16"):
        loss = tf.constant(5.0, dtype)
        assert float(opt.get_scaled_loss(loss)) == 10.0
        assert float(opt.get_scaled_loss(lambda loss=loss: loss)()) == 10.0


def test_tf_keras_get_unscaled_gradients_keeps_none_and_dtype():
    opt = sgd_lso(dynamic=False, initial_scale=2)
    grads = opt.get_unscaled_gradients([tf.constant(3.0), None, tf.constant(-4.0, "float16")])
    assert float(grads[0]) == 1.5 and grads[1] is None
    assert grads[2].dtype == tf.float16 and float(grads[2]) == -2.0


def test_tf_keras_get_unscaled_sparse_gradients():
    opt = sgd_lso(dynamic=False, initial_scale=2)
    sparse = tf.IndexedSlices(tf.constant([[4.0, 2.0], [8.0, 5.0]]), tf.constant([1, 3]),
                              tf.constant([5, 2]))
    (got,) = opt.get_unscaled_gradients([sparse])
    assert isinstance(got, tf.IndexedSlices)
    np.testing.assert_array_equal(got.values.numpy(), [[2.0, 1.0], [4.0, 2.5]])


def test_tf_keras_dynamic_defaults():
    opt = sgd_lso()
    assert (opt.initial_scale, opt.dynamic_growth_steps, float(opt.loss_scale)) == (
        2.0**15, 2000, 2.0**15)


def step(opt, var, loss_fn) -> None:
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
    opt.apply_gradients(zip(grads, [var], strict=True))


@pytest.mark.parametrize("traced", [False, True])
def test_tf_keras_dynamic_update(traced):
    opt = sgd_lso(1.0, initial_scale=2, dynamic_growth_steps=1)
    var = tf.Variable([1.0, 2.0])
    run = (lambda f: tf.function(lambda: step(opt, var, f))) if traced else (
        lambda f: lambda: step(opt, var, f))
    run(lambda: tf.reduce_sum(var * 2.0))()
    np.testing.assert_array_equal(var.numpy(), [-1.0, 0.0])
    assert float(opt.loss_scale) == 4.0
    run(lambda: tf.reduce_sum(var * np.nan))()
    np.testing.assert_array_equal(var.numpy(), [-1.0, 0.0])
    assert float(opt.loss_scale) == 2.0


def test_tf_keras_slots_follow_applied_steps():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0, momentum=1.0), initial_scale=2.0,
                                    dynamic_growth_steps=1)
    var = tf.Variable([1.0, 2.0])
    step(opt, var, lambda: tf.reduce_sum(var))
    np.testing.assert_array_equal(var.numpy(), [0.0, 1.0])
    step(opt, var, lambda: tf.reduce_sum(var))
    np.testing.assert_array_equal(var.numpy(), [-2.0, -1.0])
    assert float(opt.loss_scale) == 8.0


def test_tf_keras_iterations_differ_on_purpose_a_skip_does_not_count():
    """tf.keras counted a skipped step in ``iterations``; tf_amp, like Keras 3, does not."""
    opt = sgd_lso(1.0)
    var = tf.Variable([5.0])
    step(opt, var, lambda: tf.reduce_sum(var * 2.0))
    assert float(var[0]) == 3.0 and int(opt.iterations) == 1
    step(opt, var, lambda: tf.reduce_sum(var * np.nan))
    assert float(var[0]) == 3.0 and int(opt.iterations) == 1


def test_tf_keras_hyperparameters_exposed():
    inner = keras.optimizers.Adam(learning_rate=1.0, beta_1=0.5)
    opt = tf_amp.LossScaleOptimizer(inner)
    opt.learning_rate = 0.005
    assert float(inner.learning_rate) == pytest.approx(0.005)
    opt.use_ema, opt.ema_momentum = True, 0.88
    assert inner.use_ema is True and inner.ema_momentum == 0.88


def test_tf_keras_arbitrary_attributes_not_exposed():
    inner = keras.optimizers.SGD()
    opt = tf_amp.LossScaleOptimizer(inner)
    with pytest.raises(AttributeError):
        opt.nesterov  # noqa: B018
    opt.nesterov = True
    assert opt.nesterov and not inner.nesterov
