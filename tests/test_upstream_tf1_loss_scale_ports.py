"""TensorFlow's TF1 loss-scale scenarios, in our words, on tf_amp's ``tf.compat.v1.train`` wrapper.

Sources (read, not copied): TensorFlow's
``tensorflow/python/training/experimental/loss_scale_optimizer_test.py``
(``MixedPrecisionLossScaleOptimizer``) and ``.../mixed_precision_test.py``
(``enable_mixed_precision_graph_rewrite`` with v1 optimizers). Upstream runs most scenarios in
graph mode and eagerly; here each runs in a ``tf.Graph`` + ``tf.compat.v1.Session``, eagerly and
in a ``tf.function``. TF1's ``DynamicLossScale(initial_loss_scale, increment_period,
multiplier)`` is ``tf_amp.DynamicLossScale(initial_scale, growth_interval, growth_factor)``.
Where tf_amp differs on purpose the test says so and asserts tf_amp's behaviour (README,
"Coming from Keras / tf.keras / TF1"). The suite pins the float16 target (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.test_migration_distribute import run_scenarios
from tf_amp.enable import is_rewrite_enabled, optimizer_wants_rewrite
from tf_amp.loss_scale import DynamicLossScale
from tf_amp.optimizers.v1 import V1LossScaleOptimizer

v1 = tf.compat.v1
MODES = ("graph", "eager", "function")


class Harness:
    """One way of running a training step: built once and run in a Session (``graph``), run
    directly (``eager``), or traced once into a ``tf.function`` (``function``)."""

    def __init__(self, mode: str, sess: v1.Session | None) -> None:
        self.mode = mode
        self.sess = sess

    def step(self, build: Callable[[], Any]) -> Callable[[], None]:
        """``build`` makes one training step (in graph mode it returns the train op)."""
        if self.mode == "graph":
            op = build()
            return lambda: self.sess.run(op)
        if self.mode == "eager":
            return build

        def body() -> None:
            build()  # in a tf.function minimize returns an op, which a function may not return

        traced = tf.function(body, autograph=False)
        return lambda: traced()

    def init(self) -> None:
        """Initialises every global variable (graph mode; eager variables already are)."""
        if self.sess is not None:
            self.sess.run(v1.global_variables_initializer())

    def value(self, tensor: Any) -> Any:
        if self.sess is not None:
            return self.sess.run(tensor)
        return np.asarray(tf.convert_to_tensor(tensor))


@contextlib.contextmanager
def harness(mode: str) -> Iterator[Harness]:
    if mode == "graph":
        with tf.Graph().as_default(), v1.Session() as sess:
            yield Harness(mode, sess)
    else:
        yield Harness(mode, None)


def identity_asserting_gradient(expected: Any) -> Callable[[Any], tf.Tensor]:
    """The identity, whose gradient fails the step unless it equals ``expected`` (a number or
    a variable read when the gradient runs): it sees the gradient of the *scaled* loss."""

    @tf.custom_gradient
    def identity(x: Any) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            want = tf.cast(tf.convert_to_tensor(expected), dy.dtype)
            check = tf.debugging.assert_equal(dy, want, message="gradient of the scaled loss")
            with tf.control_dependencies([check]):
                return tf.identity(dy)

        return tf.identity(x), grad

    return identity


def scale_state(h: Harness, opt: V1LossScaleOptimizer) -> tuple[float, int]:
    """(scale, good_steps since it last changed): TF1's ``loss_scale()`` and
    ``_num_good_steps``."""
    good_steps = opt._ensure_state()[1]
    return float(h.value(opt.loss_scale)), int(h.value(good_steps))


# ---------------------------------------------------------------- loss_scale_optimizer_test
@pytest.mark.parametrize("mode", MODES)
def test_fixed_scale_multiplies_the_loss_and_minimize_applies_the_true_gradient(mode: str):
    """Ports ``testFixedLossScaleAppliedToLossWithMinimize``: with a fixed scale of 10 the
    gradient flowing back through the loss is 10 (so the loss really was scaled), and the
    variable moves by the true gradient (1) times lr 2: 5 -> 3."""
    with harness(mode) as h:
        var = tf.Variable([5.0])
        opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(2.0), 10.0)
        check = identity_asserting_gradient(10.0)
        step = h.step(lambda: opt.minimize(lambda: check(var), var_list=[var]))
        h.init()
        step()
        np.testing.assert_array_equal(h.value(var), [3.0])


def test_fixed_scale_compute_gradients_scales_the_loss_and_returns_the_true_gradient():
    """Ports ``testFixedLossScaleAppliedToLossWithGetGradients`` (graph only upstream):
    ``compute_gradients`` differentiates the scaled loss (the check sees 10) yet hands back
    the unscaled gradient, 1."""
    with harness("graph") as h:
        var = tf.Variable([2.0])
        opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), 10.0)
        ((grad, _),) = opt.compute_gradients(identity_asserting_gradient(10.0)(var), [var])
        h.init()
        np.testing.assert_array_equal(h.value(grad), [1.0])
        wrong = identity_asserting_gradient(1.0)(var)  # the check does fail on a wrong value
        ((grad_wrong, _),) = opt.compute_gradients(wrong, [var])
        with pytest.raises(tf.errors.InvalidArgumentError, match="scaled loss"):
            h.value(grad_wrong)


@pytest.mark.parametrize("mode", MODES)
def test_dynamic_scale_doubles_after_each_good_step_and_the_loss_follows(mode: str):
    """Ports ``testDynamicLossScale``: initial scale 2 growing every step; the loss gradient
    is the current scale (2, then 4) while the applied step stays the true one (lr 2: 5, 3, 1)."""
    with harness(mode) as h:
        expected = tf.Variable(2.0)
        var = tf.Variable([5.0])
        opt = tf_amp.LossScaleOptimizer(
            v1.train.GradientDescentOptimizer(2.0), DynamicLossScale(2.0, growth_interval=1)
        )
        check = identity_asserting_gradient(expected)
        step = h.step(lambda: opt.minimize(lambda: check(var), var_list=[var]))
        h.init()
        step()
        np.testing.assert_array_equal(h.value(var), [3.0])
        h.value(expected.assign(4.0))
        step()
        np.testing.assert_array_equal(h.value(var), [1.0])
        assert scale_state(h, opt)[0] == 8.0


@pytest.mark.parametrize("mode", MODES)
def test_dynamic_update_finite_step_grows_nan_step_skips_and_halves(mode: str):
    """Ports ``testDynamicUpdate``, plus what a skip must leave alone: a finite step (gradient
    2 of a vector loss) applies and doubles the scale 2 -> 4; a NaN step changes neither the
    variable nor ``global_step`` (tf_amp's skipped step does not count, on purpose) and halves
    the scale back to 2."""
    with harness(mode) as h:
        var = tf.Variable([1.0, 2.0])
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
        poison = tf.Variable(1.0, trainable=False)
        opt = tf_amp.LossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1.0), DynamicLossScale(2.0, growth_interval=1)
        )
        step = h.step(
            lambda: opt.minimize(lambda: var * 2.0 * poison, var_list=[var],
                                 global_step=global_step)
        )
        h.init()
        step()
        np.testing.assert_array_equal(h.value(var), [-1.0, 0.0])
        assert scale_state(h, opt)[0] == 4.0 and int(h.value(global_step)) == 1
        h.value(poison.assign(float("nan")))
        step()
        np.testing.assert_array_equal(h.value(var), [-1.0, 0.0])
        assert scale_state(h, opt)[0] == 2.0
        assert int(h.value(global_step)) == 1
        assert int(h.value(opt.skipped_steps)) == 1


@pytest.mark.parametrize("mode", MODES)
def test_dynamic_scale_with_momentum_slots(mode: str):
    """Ports ``testDynamicLossScaleWithSlots``: Momentum(lr 1, momentum 1) with a scale growing
    x4 every step. The accumulator sees the true gradient 1: the variable moves by 1, then by 2,
    and the scale goes 2 -> 8 -> 32. Added: an inf step leaves the slot and variable
    bit-identical and halves the scale (backoff 0.5)."""
    with harness(mode) as h:
        var = tf.Variable([1.0, 2.0])
        poison = tf.Variable(1.0, trainable=False)
        opt = tf_amp.LossScaleOptimizer(
            v1.train.MomentumOptimizer(1.0, momentum=1.0),
            DynamicLossScale(2.0, growth_interval=1, growth_factor=4.0),
        )
        step = h.step(lambda: opt.minimize(lambda: var * poison, var_list=[var]))
        h.init()
        step()
        np.testing.assert_array_equal(h.value(var), [0.0, 1.0])
        assert scale_state(h, opt)[0] == 8.0
        step()
        np.testing.assert_array_equal(h.value(var), [-2.0, -1.0])
        assert scale_state(h, opt)[0] == 32.0
        slot = opt.get_slot(var, "momentum")
        assert slot is not None
        np.testing.assert_array_equal(h.value(slot), [2.0, 2.0])
        h.value(poison.assign(float("inf")))
        step()
        np.testing.assert_array_equal(h.value(var), [-2.0, -1.0])
        np.testing.assert_array_equal(h.value(slot), [2.0, 2.0])
        assert scale_state(h, opt)[0] == 16.0


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_checkpoint_restores_scale_and_good_step_count(mode: str, tmp_path):
    """Ports ``testCheckpoint``: a scale of 1 growing every 2 good steps; after one step
    (scale 1, 1 good step) a ``tf.train.Checkpoint`` of the optimizer is saved; a second step
    grows the scale to 2 and resets the count; restoring brings back exactly (1, 1), with every
    checkpointed value matched (``assert_consumed``)."""
    with harness(mode) as h:
        var = tf.Variable([2.0])
        opt = tf_amp.LossScaleOptimizer(
            v1.train.MomentumOptimizer(1.0, momentum=1.0), DynamicLossScale(1.0, growth_interval=2)
        )
        step = h.step(lambda: opt.minimize(lambda: var + 1.0, var_list=[var]))
        h.init()
        step()
        assert scale_state(h, opt) == (1.0, 1)
        checkpoint = tf.train.Checkpoint(optimizer=opt)
        prefix = os.path.join(tmp_path, "ckpt")
        session_scope = h.sess.as_default() if h.sess is not None else contextlib.nullcontext()
        with session_scope:
            path = checkpoint.save(prefix)
            step()
            assert scale_state(h, opt) == (2.0, 0)
            status = checkpoint.restore(path)
            status.assert_consumed()
            status.run_restore_ops()
        assert scale_state(h, opt) == (1.0, 1)


def test_none_loss_scale_is_refused_with_what_to_pass():
    """Ports ``testPassingNoneToLossScale``. TF1 raised ``ValueError('loss_scale cannot be
    None')``; tf_amp raises ``TypeError`` (a wrong type, on purpose) naming what to pass."""
    with pytest.raises(TypeError, match='"dynamic", a positive number or a tf_amp.LossScale'):
        tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), None)


# --------------------------------------------------------------------- mixed_precision_test
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_enable_wraps_v1_and_keras_optimizers_with_the_given_scale(mode: str):
    """Ports ``test_wrap_optimizer``: enable_... returns the loss-scale wrapper of the
    optimizer's family carrying the scale asked for (123), marks it for the rewrite and turns
    the process-wide flag on. Added: the default ("auto" under the float16 target) is dynamic."""
    with harness(mode) as h:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(
            v1.train.GradientDescentOptimizer(1.0), 123.0
        )
        assert isinstance(opt, V1LossScaleOptimizer)
        assert isinstance(opt, tf_amp.LossScaleOptimizer)
        scale = opt.loss_scale  # in a graph, makes the state variables the initializer covers
        h.init()
        assert float(h.value(scale)) == 123.0
        assert is_rewrite_enabled() and optimizer_wants_rewrite(opt)
        default = tf_amp.enable_mixed_precision_graph_rewrite(v1.train.AdamOptimizer())
        assert default.loss_scale_policy.dynamic and default.enabled
    keras_opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(1.0), 123.0)
    assert isinstance(keras_opt, tf_amp.LossScaleOptimizer)
    assert float(keras_opt.loss_scale) == 123.0


def test_enable_refuses_non_optimizers_and_wrapped_ones_and_leaves_the_flag_off():
    """Ports ``test_optimizer_errors``: a non-optimizer (TF1: ValueError; tf_amp: TypeError,
    a wrong type), a tf_amp wrapper and Keras's own LossScaleOptimizer are refused, and none of
    the refusals turns the rewrite flag on."""
    with pytest.raises(TypeError, match="cannot wrap builtins.int"):
        tf_amp.enable_mixed_precision_graph_rewrite(1)
    assert not is_rewrite_enabled()
    wrapped = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), "dynamic")
    with pytest.raises(ValueError, match="already a tf_amp LossScaleOptimizer"):
        tf_amp.enable_mixed_precision_graph_rewrite(wrapped)
    assert not is_rewrite_enabled()
    with pytest.raises(ValueError, match="already wrapped by the tf_amp LossScaleOptimizer"):
        tf_amp.enable_mixed_precision_graph_rewrite(wrapped.inner_optimizer)
    assert not is_rewrite_enabled()
    keras_lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    with pytest.raises(ValueError):
        tf_amp.enable_mixed_precision_graph_rewrite(keras_lso)
    assert not is_rewrite_enabled()


def overflow_in_float16(var: tf.Variable) -> tf.Tensor:
    """1024 * 1024 = 2**20: fine in float32, inf once the matmul runs in float16."""
    out = var * 2.0**10
    return tf.reshape(tf.matmul(out, out), ())


def test_rewrite_is_scoped_to_tf_amp_sessions_and_functions_and_disable_keeps_scaling():
    """Ports ``test_grappler_pass_enabled`` (GPU-only upstream; tf_amp's rewrite runs on CPU
    under the pinned float16 target). TF1's enable_... switched every Session and tf.function
    of the process to float16; tf_amp's rewrite is scoped on purpose (README "Three ways in"):
    after enable_..., a plain ``Session`` / ``tf.function`` still computes 2**20, while
    ``tf_amp.Session`` / ``tf_amp.function`` overflow to inf, proving they run float16.
    ``disable_...`` turns the flag off; the wrapper keeps its loss scaling."""
    opt = tf_amp.enable_mixed_precision_graph_rewrite(v1.train.GradientDescentOptimizer(1.0))
    assert is_rewrite_enabled()
    with tf.Graph().as_default():
        var = tf.Variable([[1.0]])
        out = overflow_in_float16(var)
        with v1.Session() as sess:
            sess.run(var.initializer)
            assert sess.run(out) == 2.0**20
        with tf_amp.Session() as sess:
            sess.run(var.initializer)
            assert np.isinf(sess.run(out))
    var = tf.Variable([[1.0]])
    assert float(tf.function(lambda: overflow_in_float16(var))()) == 2.0**20
    assert np.isinf(float(tf_amp.function(lambda: overflow_in_float16(var))()))
    tf_amp.disable_mixed_precision_graph_rewrite()
    assert not is_rewrite_enabled()
    assert opt.enabled and float(opt.loss_scale) == 2.0**15


def test_enabled_graph_trains_in_a_tf_amp_session_with_dynamic_scaling():
    """The use TF1's enable_... existed for, end to end on a v1 optimizer: the wrapper it
    returns trains a graph in ``tf_amp.Session`` (rewritten), takes the finite step, and skips
    an inf step without touching weights or ``global_step``."""
    with tf.Graph().as_default():
        # small enough that the gradients times the default 2**15 stay below float16's max
        x = tf.constant([[1.0, 2.0], [3.0, 4.0]]) / 64.0
        w = v1.get_variable("w", initializer=tf.constant([[0.5], [-0.25]]))
        poison = v1.placeholder_with_default(tf.constant(1.0), [])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)) * poison
        global_step = v1.train.get_or_create_global_step()
        opt = tf_amp.enable_mixed_precision_graph_rewrite(v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss, global_step=global_step)
        with tf_amp.Session() as sess:
            sess.run(v1.global_variables_initializer())
            before = sess.run(w)
            sess.run(train)
            after = sess.run(w)
            assert not np.array_equal(before, after) and sess.run(global_step) == 1
            sess.run(train, {poison: np.inf})
            np.testing.assert_array_equal(sess.run(w), after)
            assert sess.run(global_step) == 1
            assert sess.run(opt.loss_scale) == 2.0**14 and sess.run(opt.skipped_steps) == 1


# ------------------------------------------------------------ under a MirroredStrategy
# Upstream runs each optimizer scenario under ``MirroredStrategy`` too ("Distribute"). Here: 2
# logical CPUs, a fresh strategy per run, eagerly and in a tf.function, each scenario in a
# subprocess of its own (why: tests/test_migration_distribute.py, ``facts``).
V1_STRATEGY_PORTS = '''
def v1_run(strategy, mode, fn):
    if mode == "eager":
        strategy.run(fn)
    else:
        tf.function(lambda: strategy.run(fn), autograph=False)()

@scenario
def v1_dynamic_update():
    """testDynamicUpdate (Distribute): each replica's loss is var * 2 / 2, summed: gradient 2."""
    out = {}
    for mode in ("eager", "function"):
        strategy = fresh()
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            step = tf.Variable(0, dtype=tf.int64, trainable=False)
            opt = tf_amp.LossScaleOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(1.0),
                tf_amp.DynamicLossScale(2.0, growth_interval=1),
            )
        def train(factor):
            return lambda: opt.minimize(lambda: var * factor / 2.0, var_list=[var],
                                        global_step=step) and None
        v1_run(strategy, mode, train(2.0))
        first = [local(strategy, var), float(opt.loss_scale), local(strategy, step)[0]]
        v1_run(strategy, mode, train(float("nan")))
        out[mode] = [first, [local(strategy, var), float(opt.loss_scale), local(strategy, step)[0]]]
    return out

@scenario
def v1_momentum_slots():
    """testDynamicLossScaleWithSlots (Distribute): momentum 1, scale x4 per good step."""
    out = {}
    for mode in ("eager", "function"):
        strategy = fresh()
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_amp.LossScaleOptimizer(
                tf.compat.v1.train.MomentumOptimizer(1.0, momentum=1.0),
                tf_amp.DynamicLossScale(2.0, growth_interval=1, growth_factor=4.0),
            )
        train = lambda: opt.minimize(lambda: var / 2.0, var_list=[var]) and None
        facts = []
        for _ in range(2):
            v1_run(strategy, mode, train)
            facts.append([local(strategy, var), float(opt.loss_scale)])
        out[mode] = facts
    return out
'''

V1_STRATEGY_NAMES = ["v1_dynamic_update", "v1_momentum_slots"]


@pytest.fixture(scope="module")
def strategy_facts() -> dict[str, Any]:
    """Each scenario's facts, from subprocesses started at once (2 logical CPUs each)."""
    found = run_scenarios(V1_STRATEGY_PORTS, V1_STRATEGY_NAMES)
    for got in found.values():
        assert "error" not in got, got.get("error")
    return found


def test_dynamic_update_under_mirrored_strategy(strategy_facts: dict[str, Any]):
    """Ports ``testDynamicUpdate`` (Distribute): the summed gradient 2 applies on both replicas
    and the scale grows 2 -> 4; the NaN step skips on both, global_step stays 1, 4 -> 2."""
    for mode in ("eager", "function"):
        assert strategy_facts["v1_dynamic_update"][mode] == [
            [[[-1.0, 0.0]] * 2, 4.0, 1],
            [[[-1.0, 0.0]] * 2, 2.0, 1],
        ], mode


def test_momentum_slots_under_mirrored_strategy(strategy_facts: dict[str, Any]):
    """Ports ``testDynamicLossScaleWithSlots`` (Distribute): the accumulator sees the summed
    true gradient 1: the variable moves by 1 then 2 on both replicas; the scale 2 -> 8 -> 32."""
    for mode in ("eager", "function"):
        assert strategy_facts["v1_momentum_slots"][mode] == [
            [[[0.0, 1.0]] * 2, 8.0],
            [[[-2.0, -1.0]] * 2, 32.0],
        ], mode
