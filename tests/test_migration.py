"""What users moving from Keras 3's, tf.keras 2.x's or TF1's loss-scale optimizer rely on.

Each test is one scenario of issue 16: a bug those users hit, a config or file written by the
other wrappers, an attribute or a misuse they expect to behave as it did there. The ports of
the upstream test suites' own scenarios are in ``tests/test_upstream_loss_scale_ports.py``.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp


def sgd_step(opt, var: tf.Variable, true_grad: float = 1.0) -> None:
    """One Keras-3-style step on ``loss = true_grad * var`` (its gradient is ``true_grad``)."""
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(var * true_grad))
    opt.apply(tape.gradient(loss, [var]), [var])


# ------------------------------------------------------------------------------ the bugs
def test_counters_are_readable_before_the_first_step():
    static = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False, initial_scale=2.0)
    assert static.dynamic_counter is None  # a static scale has no counter (Keras, tf.keras)
    assert float(static.loss_scale) == 2.0 and int(static.skipped_steps) == 0
    dynamic = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    assert int(dynamic.dynamic_counter) == 0 and int(dynamic.skipped_steps) == 0
    dynamic.loss_scale = 16.0  # settable before build too
    assert float(dynamic.scale_loss(tf.constant(1.0))) == 16.0


def test_checkpoint_restored_into_an_unbuilt_wrapper_is_the_scale_of_its_first_step(tmp_path):
    """Scale fell 8 -> 4 and was saved; a fresh wrapper restores it before it is built. The
    first step must scale and unscale with 4: true gradient 1, lr 1, from 0 ends at -1."""
    var = tf.Variable([0.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    sgd_step(opt, var, np.inf)  # skipped: 8 -> 4
    assert float(opt.loss_scale) == 4.0 and float(var[0]) == 0.0
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))

    fresh_var = tf.Variable([0.0])
    fresh = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    tf.train.Checkpoint(optimizer=fresh).restore(path)
    assert float(fresh.loss_scale) == 4.0  # restored at once, not at build
    assert float(fresh.scale_loss(tf.constant(1.0))) == 4.0
    sgd_step(fresh, fresh_var)
    assert float(fresh_var[0]) == -1.0
    assert int(fresh.skipped_steps) == 1


# ------------------------------------------------------------------- checkpoints both ways
def adam_trained(opt, var: tf.Variable, steps: int = 3):
    for _ in range(steps):
        sgd_step(opt, var, 0.5)
    return opt


def test_wrapper_checkpoint_restores_into_the_plain_optimizer(tmp_path):
    var = tf.Variable([1.0, 2.0])
    wrapper = adam_trained(tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1)), var)
    path = tf.train.Checkpoint(optimizer=wrapper, var=var).save(str(tmp_path / "c"))

    plain_var = tf.Variable([0.0, 0.0])
    plain = keras.optimizers.Adam(0.1)
    status = tf.train.Checkpoint(optimizer=plain, var=plain_var).restore(path)
    plain.build([plain_var])
    status.assert_existing_objects_matched()  # every plain variable found its value
    assert int(plain.iterations) == 3
    for got, want in zip(plain.variables, wrapper.inner_optimizer.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(AssertionError, match="loss_scale"):
        status.assert_consumed()  # only the loss-scale state is left over
    status.expect_partial()


def test_plain_checkpoint_restores_into_a_wrapper_whose_scale_starts_afresh(tmp_path):
    var = tf.Variable([1.0, 2.0])
    plain = keras.optimizers.Adam(0.1)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * 0.5)
        plain.apply(tape.gradient(loss, [var]), [var])
    path = tf.train.Checkpoint(optimizer=plain, var=var).save(str(tmp_path / "c"))

    new_var = tf.Variable([0.0, 0.0])
    wrapper = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=64.0)
    tf.train.Checkpoint(optimizer=wrapper, var=new_var).restore(path).assert_nontrivial_match()
    wrapper.build([new_var])
    assert int(wrapper.iterations) == 3 and float(wrapper.loss_scale) == 64.0
    for got, want in zip(wrapper.inner_optimizer.variables, plain.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    sgd_step(wrapper, new_var, 0.5)  # and training goes on from the restored moments
    sgd_step(plain, var, 0.5)
    np.testing.assert_allclose(new_var.numpy(), var.numpy(), rtol=1e-6)
