"""TF_ENABLE_AUTO_MIXED_PRECISION: parsing, reversible patches, and unmodified scripts.

Scripts run in subprocesses with the startup hook processed exactly as at interpreter start
(``site.addsitedir`` on a directory holding ``tf_amp_autoenable.pth``, which is what site does
for site-packages), so they show what an installed tf_amp does to a script that never imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import timeit
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.legacy.saving import legacy_h5_format
from tensorflow.python.training import session_manager

from tests.e2e_helpers import half_ops, half_ops_of_functions
from tf_amp._upstream import keras as upstream_keras
from tf_amp.hardware import TargetChoice
from tf_amp.runtime import activation, auto_loss_scale
from tf_amp.runtime.activation import (
    ENV_ENABLE,
    ENV_GRAPH_REWRITE,
    ENV_LOSS_SCALING,
    Settings,
)

REPO = Path(__file__).resolve().parents[1]
PTH = REPO / "tf_amp" / "runtime" / "tf_amp_autoenable.pth"
ALL_VARS = (ENV_ENABLE, ENV_GRAPH_REWRITE, ENV_LOSS_SCALING)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Settings(False, False)),
        ({ENV_ENABLE: "1"}, Settings(True, True)),
        ({ENV_ENABLE: "true"}, Settings(True, True)),
        ({ENV_ENABLE: "0"}, Settings(False, False)),
        ({ENV_ENABLE: " "}, Settings(False, False)),
        ({ENV_ENABLE: "1", ENV_GRAPH_REWRITE: "0"}, Settings(False, True)),
        ({ENV_ENABLE: "1", ENV_LOSS_SCALING: "off"}, Settings(True, False)),
        ({ENV_GRAPH_REWRITE: "1"}, Settings(True, False)),
        ({ENV_LOSS_SCALING: "YES"}, Settings(False, True)),
    ],
)
def test_settings_from_env(env: dict[str, str], expected: Settings) -> None:
    # For a float16 target, TF_ENABLE_AUTO_MIXED_PRECISION=1 turns both halves on.
    float16 = TargetChoice("float16", "test")
    assert Settings.from_env(env).for_target(float16) == expected


@pytest.mark.parametrize(
    ("target", "rewrite", "scaling"),
    [("float16", True, True), ("bfloat16", True, False), ("float32", False, False)],
)
def test_enable_alone_turns_on_what_the_target_needs(
    target: str, rewrite: bool, scaling: bool
) -> None:
    settings = Settings.from_env({ENV_ENABLE: "1"})
    assert settings == Settings(None, None)  # decided once TensorFlow shows the device
    assert settings.for_target(TargetChoice(target, "test")) == Settings(rewrite, scaling)
    # the specific variables still force their half, whatever the target
    forced = Settings.from_env({ENV_ENABLE: "1", ENV_LOSS_SCALING: "1"})
    assert forced.for_target(TargetChoice(target, "test")) == Settings(rewrite, True)


@pytest.mark.parametrize("name", ALL_VARS)
@pytest.mark.parametrize("value", ["2", "maybe", "enable", "1.0"])
def test_garbage_values_raise_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name) as info:
        Settings.from_env({name: value})
    assert repr(value) in str(info.value)


# ----------------------------------------------------------------------------- in process


def _patched_attributes() -> list[tuple[Any, str]]:
    """Every (owner, attribute) the full activation replaces."""
    v1_opt = tf.compat.v1.train.Optimizer
    return [
        (tf, "function"),
        (tf.compat.v1, "Session"),
        (tf.compat.v1, "InteractiveSession"),
        (tf.compat.v1, "disable_eager_execution"),
        (session_manager, "session"),
        (tf.GradientTape, "gradient"),
        (v1_opt, "minimize"),
        (v1_opt, "compute_gradients"),
        (v1_opt, "apply_gradients"),
        (v1_opt, "variables"),
        *_saver_patches_unless_held_for_good(),
        (keras.Model, "compile"),
        *((upstream_keras.TensorFlowTrainer, name) for name in (
            "make_train_function", "make_test_function", "make_predict_function")),
        (keras.optimizers.Optimizer, "apply"),
        (keras.optimizers.LossScaleOptimizer, "scale_loss"),
        (keras.optimizers.Optimizer, "scale_loss"),
        (legacy_h5_format, "save_model_to_hdf5"),
    ]


def _saver_patches_unless_held_for_good() -> list[tuple[Any, str]]:
    """The activation's Saver patches, unless a v1 wrapper made earlier in this worker process
    installed them for good (then they are there before and after)."""
    from tf_amp.optimizers import _v1_saver
    from tf_amp.runtime import _patches

    held = _patches.REGISTRY.installed().get((tf.compat.v1.train.Saver, "build"), frozenset())
    if _v1_saver.SAVER_HOLDER in held:
        return []
    return [(tf.compat.v1.train.Saver, "build"), (tf.compat.v1.train.Saver, "restore")]


def test_activation_patches_and_restores_exactly() -> None:
    saver_held_for_good = not _saver_patches_unless_held_for_good()
    originals = [getattr(owner, name) for owner, name in _patched_attributes()]
    with activation.activated(Settings(graph_rewrite=True, loss_scaling=True)):
        assert activation.patch_count() == len(originals) + 2 * saver_held_for_good
        from tf_amp.runtime.session import Session

        assert tf.compat.v1.Session is Session
        patched = [getattr(owner, name) for owner, name in _patched_attributes()]
        assert not any(a is b for a, b in zip(originals, patched, strict=True))
    current = [getattr(owner, name) for owner, name in _patched_attributes()]
    assert all(a is b for a, b in zip(originals, current, strict=True))
    assert activation.patch_count() == 0 and not activation.is_active()
    assert "make_train_function" not in vars(keras.Model)


def test_env_tf1_optimizer_that_hands_compute_gradients_to_another_is_scaled() -> None:
    # SyncReplicasOptimizer and Horovod's DistributedOptimizer override compute_gradients to
    # call another optimizer's: the base method reached on that one must scale the loss.
    class Delegating(tf.compat.v1.train.Optimizer):
        def __init__(self, inner: tf.compat.v1.train.Optimizer) -> None:
            super().__init__(use_locking=False, name="Delegating")
            self._inner = inner

        def compute_gradients(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            return self._inner.compute_gradients(*args, **kwargs)

        def apply_gradients(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            return self._inner.apply_gradients(*args, **kwargs)

    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.get_variable("w", [2, 1])
            loss = tf.reduce_sum(w * w, name="loss")
            Delegating(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
            readers = [op for op in graph.get_operations() if loss in op.inputs]
    # Unscaled, only the gradient's own ops read it; scaled, a Mul by the scale does.
    assert [op.type for op in readers if not op.name.startswith("gradients")] == ["Mul"], [
        op.name for op in readers]


def test_each_half_patches_only_its_own_part() -> None:
    original_function = tf.function
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        assert tf.function is original_function
        assert tf.GradientTape.gradient.__module__ == "tf_amp.runtime.auto_loss_scale"
    with activation.activated(Settings(graph_rewrite=True, loss_scaling=False)):
        assert tf.function is not original_function
        assert tf.GradientTape.gradient.__module__.startswith("tensorflow")


def test_library_functions_keep_plain_tf_function() -> None:
    with activation.activated():
        from tf_amp.runtime.function import AmpTfFunction

        user = tf.function(lambda t: t)  # defined here: user code
        assert isinstance(user, AmpTfFunction)
        assert isinstance(user, tf.types.experimental.PolymorphicFunction)  # still a tf.function

        def library_fn(t: tf.Tensor) -> tf.Tensor:
            return t

        library_fn.__module__ = "keras.src.somewhere"
        assert not isinstance(tf.function(library_fn), AmpTfFunction)


def test_a_function_made_under_the_activation_runs_float32_after_deactivate() -> None:
    """A ``tf.function`` made while the environment was on kept rewriting every call and
    trace after ``deactivate()``, which turned every other part of tf_amp off. It now runs as
    the ``tf.function`` it is; ``tf_amp.function`` asked for the rewrite and keeps it."""
    import tf_amp

    w = tf.fill((8, 8), 1.0001)  # 1.0 in float16: the half MatMul gives 8.0, float32 8.0008
    with activation.activated():
        made_under = tf.function(lambda t: tf.matmul(t, w))
        asked_for = tf_amp.function(lambda t: tf.matmul(t, w))
        assert made_under(tf.ones((2, 8)))[0, 0] == 8.0
    for rows in (2, 3):  # the signature rewritten before, and a new one
        assert float(made_under(tf.ones((rows, 8)))[0, 0]) == pytest.approx(8.0008, abs=1e-6)
        assert asked_for(tf.ones((rows, 8)))[0, 0] == 8.0
    assert len(made_under.reports) == 1
    with activation.activated():
        assert made_under(tf.ones((3, 8)))[0, 0] == 8.0


def test_user_modules_still_export_to_saved_model(tmp_path: Path) -> None:
    """tf.saved_model.save only exports tf.function attributes; ours still are (float32)."""
    with activation.activated():

        class Net(tf.Module):
            def __init__(self) -> None:
                self.w = tf.Variable(tf.ones((8, 8)))

            @tf.function
            def __call__(self, t: tf.Tensor) -> tf.Tensor:
                return tf.matmul(t, self.w)

        net = Net()
        out = net(tf.ones((2, 8)))
        (concrete, *_) = net.__call__.rewritten_concrete_functions()
        assert "MatMul" in half_ops(concrete.graph.as_graph_def())
        tf.saved_model.save(net, str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_allclose(loaded(tf.ones((2, 8))).numpy(), out.numpy())


def test_a_nested_tf_function_exports_float32_with_its_jit_mark(tmp_path: Path) -> None:
    """TensorFlow's own trace of the outer function (export, get_concrete_function) ran the
    inner call rewritten: the SavedModel held its half MatMul and lost its jit_compile=False
    mark."""
    with activation.activated():

        class Net(tf.Module):
            def __init__(self) -> None:
                self.w = tf.Variable(tf.eye(8) * 0.5)

            @tf.function(jit_compile=False)
            def inner(self, t: tf.Tensor) -> tf.Tensor:
                return tf.nn.relu(tf.matmul(t, self.w))

            @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
            def serve(self, t: tf.Tensor) -> tf.Tensor:
                return tf.matmul(self.inner(t), self.w)

        net = Net()
        graph_def = net.serve.get_concrete_function().graph.as_graph_def()
        net.serve(tf.ones((2, 8)))  # runs rewritten
        tf.saved_model.save(net, str(tmp_path / "model"))
        assert "MatMul" in half_ops_of_functions(net.serve.rewritten_concrete_functions())

    assert half_ops(graph_def) == set()
    (inner,) = [f for f in graph_def.library.function if "inner" in f.signature.name]
    assert "_XlaMustCompile" in inner.attr and inner.attr["_XlaMustCompile"].b is False
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_array_equal(loaded.serve(tf.ones((2, 8))).numpy(), np.full((2, 8), 0.25))


def test_an_uncompiled_models_predict_is_rewritten() -> None:
    """The environment hooked a Keras 3 model at ``compile`` only: one built or loaded for
    inference ran ``predict`` float32, in silence."""
    from tf_amp.runtime import keras_fit

    with activation.activated():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
        out = model.predict(np.ones((4, 16), np.float32), verbose=0)
        assert keras_fit.is_installed(model)
        rewritten = keras_fit.rewritten_functions(model)["predict"].rewritten_concrete_functions()
        assert "MatMul" in half_ops_of_functions(rewritten)
    assert out.dtype == np.float32


def test_keras_export_archive_writes_a_user_endpoint(tmp_path: Path) -> None:
    """Keras's export wraps an endpoint with ``tf.function``: a user function becomes ours, and
    its method ``concrete_functions`` was taken for a list ("'method' object is not
    iterable"); the method is ``rewritten_concrete_functions`` now."""
    with activation.activated():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            "serve", lambda t: model(t), input_signature=[tf.TensorSpec([None, 16], tf.float32)]
        )
        archive.write_out(str(tmp_path / "exported"), verbose=False)
    x = np.ones((2, 16), np.float32)
    loaded = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_allclose(loaded.serve(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_unmodified_custom_loop_scales_the_loss_and_skips_overflow() -> None:
    with activation.activated():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        opt = keras.optimizers.SGD(0.05)  # a plain optimizer: nobody asked for loss scaling

        @tf.function
        def step(x: tf.Tensor, y: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2) * factor
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        rng = np.random.default_rng(0)
        x = rng.random((32, 8), dtype=np.float32)
        y = x.sum(axis=1, keepdims=True)
        losses = [float(step(x, y, tf.constant(1.0))) for _ in range(30)]
        state = auto_loss_scale.current_state()
        kernel = model.layers[0].kernel.numpy().copy()
        iterations = int(opt.iterations)
        step(x, y, tf.constant(np.inf))  # overflow: the step must change nothing
        after = auto_loss_scale.current_state()

        assert "MatMul" in half_ops(step.rewritten_concrete_functions()[0].graph.as_graph_def())
        assert losses[-1] < 0.5 * losses[0]
        assert int(state.good_steps) + int(state.skipped_steps) == 30
        np.testing.assert_array_equal(kernel, model.layers[0].kernel.numpy())
        assert int(opt.iterations) == iterations
        assert float(after.scale) == float(state.scale) / 2
        assert int(after.skipped_steps) == int(state.skipped_steps) + 1


def test_input_gradients_are_not_scaled_and_odd_gradients_pass() -> None:
    """The custom-loop scaling scaled every user ``tape.gradient`` of a float scalar: a
    saliency map (the gradient of an input, which no optimizer applies and no skip can hold
    back) overflowed at 2**15 and came back NaN on every call; integer, complex and ragged
    gradients and ``output_gradients`` in list form raised."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 8)).astype("float32"))
    w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    c = tf.Variable(tf.complex([1.0, 2.0], [0.5, -1.0]))
    count = tf.constant(3)
    ragged = tf.ragged.constant([[[1.0, 2.0]], [[3.0, 4.0], [0.5, 0.5]]], ragged_rank=1)

    def saliency(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(model(x)))
        return tape.gradient(loss, x)

    def odd_ones(r):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([count, r.flat_values])
            loss = tf.reduce_sum(w * w) * tf.cast(count, tf.float32) + tf.reduce_sum(
                tf.abs(c) ** 2) + tf.reduce_sum(tf.ragged.map_flat_values(tf.matmul, r, w)) * 1e-3
        by_source = tape.gradient(loss, [w, count, c, r],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        seeded = tape.gradient(loss, w, output_gradients=[tf.constant(2.0)])
        return by_source, seeded

    want_saliency = tf.function(saliency)(x)
    want_odd = odd_ones(ragged)
    with activation.activated():
        got_saliency = [tf.function(saliency)(x) for _ in range(3)]
        got_odd = odd_ones(ragged)
    for got in got_saliency:
        np.testing.assert_allclose(got, want_saliency, rtol=2e-2, atol=2e-2)
    for got, want in zip(tf.nest.flatten(got_odd, expand_composites=True),
                         tf.nest.flatten(want_odd, expand_composites=True), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_per_example_and_accumulated_gradients_are_checked_where_applied() -> None:
    """Per-example gradients in a ``tf.map_fn`` body (a loop body the apply's graph walk
    passes through: scaled, and checked whole, since the body's flags stay in it), and
    gradients accumulated in variables by one ``tf.function`` and applied by another (no
    data path to the apply: unscaled). Both applies skip a non-finite step (an inf input
    here), which once reached the weights as NaN for good."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 16)).astype("float32"))
    y = tf.constant(rng.normal(size=(32, 1)).astype("float32"))

    def per_example_and_accumulated() -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        weights = model.trainable_variables
        opt = keras.optimizers.SGD(2e-3)
        sums = [tf.Variable(tf.zeros_like(v)) for v in weights]
        factor = tf.Variable(1.0)

        def example_gradients(pair):
            with tf.GradientTape() as tape:
                loss = 100.0 * tf.reduce_sum((model(pair[0][None] * factor) - pair[1]) ** 2)
            return tape.gradient(loss, weights)

        @tf.function
        def per_example_step():
            grads = tf.map_fn(example_gradients, (x, y),
                              fn_output_signature=[tf.float32] * len(weights))
            opt.apply([tf.reduce_mean(g, 0) for g in grads], weights)

        @tf.function
        def accumulate(i):
            with tf.GradientTape() as tape:
                loss = 100.0 * tf.reduce_sum((model(x[i:i + 8] * factor) - y[i:i + 8]) ** 2)
            for total, g in zip(sums, tape.gradient(loss, weights), strict=True):
                total.assign_add(g)

        @tf.function
        def apply_sums():
            opt.apply([total / 32.0 for total in sums], weights)
            for total in sums:
                total.assign(tf.zeros_like(total))

        def one_round() -> None:
            per_example_step()
            for i in range(0, 32, 8):
                accumulate(i)
            apply_sums()

        losses = []
        for _ in range(10):
            one_round()
            losses.append(float(tf.reduce_mean((model(x) - y) ** 2)))
        before = [v.numpy() for v in weights]
        factor.assign(np.inf)
        one_round()
        return losses, before, [v.numpy() for v in weights]

    want_losses, _, _ = per_example_and_accumulated()
    with activation.activated():
        got_losses, before, after = per_example_and_accumulated()
        state = auto_loss_scale.current_state()
    for was, now in zip(before, after, strict=True):
        np.testing.assert_array_equal(was, now)  # the inf round changed nothing
    # The per-example step overflowed at the first scales and backed off (the accumulated
    # one is unscaled and did not): then both follow float32's descent, a round or two late.
    assert int(state.skipped_steps) > 2
    assert got_losses[-1] < 0.1 * got_losses[0]
    assert got_losses[-1] < 2 * want_losses[len(want_losses) // 2]


def _tiny_gradients_applied(shape: str) -> np.ndarray:
    """The first kernel gradient an apply got, for a loss of 1e-8 * mse (float16 underflows
    it unless loss-scaled), in a step of the given ``shape``; the learning rate is 0."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 4)).astype("float32"))
    models = [keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]) for _ in range(2)]
    opts = [keras.optimizers.SGD(0.0) for _ in models]
    seen = tf.Variable(tf.zeros((4, 1)))

    def gradients(model: keras.Model, rows: Any = slice(None)) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = 1e-8 * tf.reduce_mean((model(x[rows]) - 1.0) ** 2)
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def step(flag: tf.Tensor) -> None:
        first, second = models
        if shape == "gan_second_applied_first":
            grads, other = gradients(first), gradients(second)
            opts[1].apply(other, second.trainable_variables)
        elif shape == "accumulated_in_a_loop":
            grads = [tf.zeros_like(v) for v in first.trainable_variables]
            for i in tf.range(4):
                more = gradients(first, slice(2 * i, 2 * i + 2))
                grads = [a + b / 4 for a, b in zip(grads, more, strict=True)]
        elif shape == "rows_kept_by_scatter_nd":  # a pure op, not a variable's scatter
            grads = gradients(first)
            rows = tf.constant([[0], [1]])
            grads[0] = tf.scatter_nd(rows, tf.gather_nd(grads[0], rows), tf.shape(grads[0]))
        elif shape == "computed_in_a_branch":
            if flag:
                grads = gradients(first)
            else:
                grads = [tf.zeros_like(v) for v in first.trainable_variables]
        else:  # twenty micro-batches unrolled
            grads = [tf.zeros_like(v) for v in first.trainable_variables]
            for i in range(20):
                more = gradients(first, slice(i % 8, i % 8 + 1))
                grads = [a + b / 20 for a, b in zip(grads, more, strict=True)]
        opts[0].apply(grads, first.trainable_variables)
        seen.assign(grads[0])

    step(tf.constant(True))
    return seen.numpy()


@pytest.mark.parametrize("shape", ["gan_second_applied_first", "accumulated_in_a_loop",
                                   "computed_in_a_branch", "twenty_micro_batches",
                                   "rows_kept_by_scatter_nd"])
def test_applied_gradients_are_scaled_wherever_they_were_computed(shape: str) -> None:
    """Gradients a Keras apply takes must be loss-scaled, or float16 flushes small ones to
    zero. A first cut of per-call scaling left these unscaled (r4): the other GAN call whose
    apply came first dropped this one; a loop body or branch holding the call was finished
    before the apply; a 17th call pushed out the first."""
    want = _tiny_gradients_applied(shape)
    with activation.activated():
        got = _tiny_gradients_applied(shape)
    assert np.abs(want[:2]).min() > 0
    np.testing.assert_allclose(got, want, rtol=2e-2)


def test_a_slice_of_a_weight_updated_by_hand_keeps_its_call_unscaled() -> None:
    """``a[0:2].assign(...)`` (a ``ResourceStridedSliceAssign``) was not seen as a write:
    the call was scaled for the apply of its other gradient, and its overflow at 2**15
    went into ``a`` as -inf while the apply skipped (r5)."""

    def step_result() -> tuple[np.ndarray, np.ndarray]:
        a, b = tf.Variable(tf.ones((4, 2))), tf.Variable(tf.ones((2,)))
        opt = keras.optimizers.SGD(0.1)

        @tf.function
        def step() -> None:
            with tf.GradientTape() as tape:
                loss = 3.0 * tf.reduce_sum(tf.matmul(tf.ones((1, 4)), a) * b)
            grad_a, grad_b = tape.gradient(loss, [a, b])
            a[0:2].assign(a[0:2] - 0.1 * grad_a[0:2])
            opt.apply([grad_b], [b])

        step()
        return a.numpy(), b.numpy()

    want = step_result()
    with activation.activated():
        got = step_result()
    for have, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(have, expected, rtol=1e-2)


def test_a_gradient_helper_function_traced_inside_a_step_is_reused_elsewhere() -> None:
    """A ``tf.function`` that computes gradients, traced inside a step's trace, is reused by
    TensorFlow from the step's other traces and when called alone: the scale switch it
    captured from the first step's graph was "out of scope" there (r5)."""

    def run() -> list[float]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(1e-2)
        x, y = tf.ones((8, 4)), tf.zeros((8, 1))

        @tf.function
        def compute_grads() -> tuple[tf.Tensor, list[tf.Tensor]]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            return loss, tape.gradient(loss, model.trainable_variables)

        @tf.function
        def train_step(clip: bool) -> tf.Tensor:
            loss, grads = compute_grads()
            if clip:
                grads, _ = tf.clip_by_global_norm(grads, 1.0)
            opt.apply(grads, model.trainable_variables)
            return loss

        return [float(train_step(True)), float(train_step(False)), float(compute_grads()[0])]

    want = run()
    with activation.activated():
        got = run()
    np.testing.assert_allclose(got, want, rtol=2e-2)


def test_a_training_loop_inside_one_call_backs_off_within_the_call() -> None:
    """A ``tf.range`` training loop in one ``tf.function`` call: each step must read the scale
    the last step's apply left. A scale read once outside the loop (where the switch that
    turns scaling on lives) overflowed at 2**15 on every step of the call, and skipped all
    of them."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(64, 8)).astype("float32") * 3)
    y = tf.constant(rng.normal(size=(64, 1)).astype("float32"))
    with activation.activated():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(1e-3)
        start = [w.numpy() for w in model.trainable_variables]

        @tf.function
        def train(steps: tf.Tensor) -> None:
            for _ in tf.range(steps):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(x) - y) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply(grads, model.trainable_variables)

        train(tf.constant(12))
        state = auto_loss_scale.current_state()
    assert 0 < int(state.skipped_steps) < 12  # overflowed at first, then backed off
    assert int(opt.iterations) == 12 - int(state.skipped_steps)
    assert all(np.isfinite(w.numpy()).all() for w in model.trainable_variables)
    assert any((w.numpy() != s).any() for w, s in zip(model.trainable_variables, start,
                                                       strict=True))


def test_gradients_combined_from_several_calls_are_checked_whole() -> None:
    """Gradients summed over two micro-batches, or two tapes' gradients clipped then applied
    by two optimizers: the apply took the latest call's flag alone (none of the tensors it
    was given came out of a call), so an overflow in the first micro-batch, or in the other
    tape, reached the weights: NaN for good. Such an apply now checks what it is given."""
    rng = np.random.RandomState(0)
    batches = [rng.randn(16, 8).astype("float32") * 30, rng.randn(16, 8).astype("float32")]
    targets = rng.randn(16, 1).astype("float32")
    with activation.activated():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        head = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        body_opt, head_opt = keras.optimizers.SGD(1e-5), keras.optimizers.SGD(1e-5)

        @tf.function
        def step():
            summed = [tf.zeros_like(v) for v in model.trainable_variables]
            for x in batches:  # micro-batch 0's gradients overflow at the first scales
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - targets))
                grads = tape.gradient(loss, model.trainable_variables)
                summed = [s + g / 2 for s, g in zip(summed, grads, strict=True)]
            with tf.GradientTape() as tape:  # a second tape whose gradients stay finite
                head_loss = tf.reduce_mean(tf.square(head(targets) - 1.0))
            head_grads = tape.gradient(head_loss, head.trainable_variables)
            summed, _ = tf.clip_by_global_norm(summed, 1e6)
            head_grads, _ = tf.clip_by_global_norm(head_grads, 1e6)
            body_opt.apply_gradients(zip(summed, model.trainable_variables, strict=True))
            head_opt.apply_gradients(zip(head_grads, head.trainable_variables, strict=True))
            return loss

        losses = [float(step()) for _ in range(14)]
        state = auto_loss_scale.current_state()
    assert all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)
    assert int(state.skipped_steps) > 0  # it overflowed, and backed off
    assert int(body_opt.iterations) > 0 and losses[-1] < losses[0]


def _steps_that_update_weights_without_an_apply(
    kind: str, traced: bool
) -> tuple[list[float], list[np.ndarray]]:
    """Four steps that move the weights without a Keras ``apply`` of a loss-scaled gradient:
    ``manual`` (``w.assign_sub(lr * g)``) or ``sam`` (Sharpness-Aware Minimization: the first
    gradient perturbs the weights, the second, taken there, is applied): losses and weights.
    At the first loss scale, 2**15, the first gradient overflows float16 in the backward
    pass; unscaled it does not. Eager ops are not rewritten: the eager model computes in
    float16 by its Keras policy."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(64, 8)).astype("float32") * 3)
    y = tf.constant(rng.normal(size=(64, 1)).astype("float32"))
    keras.utils.set_random_seed(0)
    policy = None if traced else "mixed_float16"
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, dtype=policy),
                              keras.layers.Dense(1, dtype=policy)])
    weights = model.trainable_variables
    opt = keras.optimizers.SGD(1e-3)

    def gradients() -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.cast(model(x), tf.float32) - y) ** 2)
        return loss, tape.gradient(loss, weights)

    def step() -> tf.Tensor:
        loss, grads = gradients()
        if kind == "manual":
            for w, g in zip(weights, grads, strict=True):
                w.assign_sub(1e-3 * g)
            return loss
        norm = tf.linalg.global_norm(grads)
        nudges = [0.05 * g / (norm + 1e-12) for g in grads]
        for w, nudge in zip(weights, nudges, strict=True):
            w.assign_add(nudge)
        _, sharp_grads = gradients()
        for w, nudge in zip(weights, nudges, strict=True):
            w.assign_sub(nudge)
        if kind == "gsam":  # the perturbing gradient is also part of the applied one
            sharp_grads = [a - 0.1 * b for a, b in zip(sharp_grads, grads, strict=True)]
        opt.apply(sharp_grads, weights)
        return loss

    run = tf.function(step) if traced else step
    losses = [float(run()) for _ in range(4)]
    return losses, [w.numpy() for w in weights]


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "eager"])
@pytest.mark.parametrize("kind", ["manual", "sam", "gsam"])
def test_gradients_that_no_apply_takes_are_not_scaled(kind: str, traced: bool) -> None:
    """Every user ``tape.gradient`` call was loss-scaled, wherever its gradients went: a
    manual ``assign_sub`` update, or SAM's perturbing gradient, had no step to skip, and an
    overflow at the first scale reached the weights: NaN from step 2 for good. Only a call
    whose gradients an ``apply`` takes is scaled now (SAM's second one), so such a step
    computes what float32 does, within float16's tolerance."""
    want_losses, want_weights = _steps_that_update_weights_without_an_apply(kind, traced)
    with activation.activated():
        got_losses, got_weights = _steps_that_update_weights_without_an_apply(kind, traced)
        state = auto_loss_scale.current_state()
    assert all(np.isfinite(w).all() for w in got_weights)
    if kind == "manual":
        np.testing.assert_allclose(got_losses, want_losses, rtol=1e-2)
        for got, want in zip(got_weights, want_weights, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)
    else:  # SAM's applied gradient is scaled: its overflows are skipped while the scale backs off
        assert int(state.skipped_steps) + int(state.good_steps) > 0
        assert got_losses[-1] <= got_losses[0]


def _loop_that_scales_its_own_loss(
    scaling: str, settings: Settings, steps: int = 20
) -> tuple[list[np.ndarray], int, bool]:
    """A custom loop that scales its loss itself (``scale_loss``, then the optimizer's
    ``apply``), run under the activation: the weights, the inner optimizer's step count, and
    whether the automatic custom-loop scale was ever made. ``scaling``: ``tf_amp`` or
    ``keras`` (their ``LossScaleOptimizer``), ``keras_per_example`` (Keras's, the mean taken
    after scaling each example's loss), ``factor`` (a plain optimizer's ``loss_scale_factor``)."""
    import tf_amp

    with activation.activated(settings):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        if scaling == "factor":
            inner = opt = keras.optimizers.SGD(0.01, loss_scale_factor=1024.0)
        else:
            inner = keras.optimizers.SGD(0.01)
            opt = (tf_amp.LossScaleOptimizer if scaling == "tf_amp" else
                   keras.optimizers.LossScaleOptimizer)(inner)
        rng = np.random.default_rng(0)
        x = rng.random((64, 16), dtype=np.float32)
        y = rng.random((64, 1), dtype=np.float32)

        @tf.function
        def step() -> None:
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean((model(x) - y) ** 2, axis=1)
                if scaling == "keras_per_example":
                    scaled = tf.reduce_mean(opt.scale_loss(per_example))
                else:
                    scaled = opt.scale_loss(tf.reduce_mean(per_example))
            opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

        for _ in range(steps):
            step()
        made = auto_loss_scale.made_any_state()
        return [w.numpy() for w in model.weights], int(inner.iterations), made


@pytest.mark.parametrize("scaling", ["tf_amp", "keras", "keras_per_example", "factor"])
def test_a_loss_the_script_scales_itself_is_not_scaled_again(scaling: str) -> None:
    """Scaled twice (2**15 x 2**15 overflows float16), a tf_amp wrapper skipped every step of
    this loop: its scale stops at 1, and the automatic scale, whose flag its apply never takes,
    stayed at 2**15. Keras's own wrapper fell to 0.5 and skipped 16 of 40; a plain optimizer
    with ``loss_scale_factor`` skipped 11 of 20. Now a loss scaled by the script's optimizer,
    or computed from one, is left to it: the loop trains exactly as with the environment's
    loss scaling switched off."""
    both = _loop_that_scales_its_own_loss(scaling, Settings(True, True))
    alone = _loop_that_scales_its_own_loss(scaling, Settings(True, False))
    weights, iterations, made = both
    assert not made
    assert iterations == alone[1] >= 18  # at most the wrapper's own first overflows skipped
    for ours, theirs in zip(weights, alone[0], strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_scaling_a_number_still_works_under_the_activation() -> None:
    """Marking a scaled loss must not break ``scale_loss`` of a Python or NumPy number (a
    ``loss_scale_factor`` times a float is a float, which cannot be referenced weakly)."""
    with activation.activated():
        opt = keras.optimizers.SGD(0.1, loss_scale_factor=8.0)
        assert opt.scale_loss(2.0) == 16.0
        assert opt.scale_loss(np.float32(2.0)) == 16.0
        assert float(opt.scale_loss(tf.constant(2.0))) == 16.0


def _gradient_penalty_steps(steps: int = 2) -> tuple[list[np.ndarray], keras.optimizers.SGD]:
    """WGAN-GP-style steps: the inner tape's gradient is differentiated again by the outer."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    opt = keras.optimizers.SGD(0.1)
    x = tf.constant(np.random.default_rng(1).random((16, 4), dtype=np.float32))
    for _ in range(steps):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                score = tf.reduce_sum(model(x))
            slopes = tf.norm(inner.gradient(score, x), axis=1)
            loss = tf.reduce_mean(model(x)) + tf.reduce_mean((slopes - 1.0) ** 2)
        grads = outer.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return [v.numpy() for v in model.trainable_variables], opt


def test_nested_tape_gradient_penalty_is_unchanged_by_loss_scaling() -> None:
    """The inner gradient is recorded by the outer tape: it is left unscaled (the fused unscale
    op has no gradient), the outer one is loss-scaled, and no finite flag is left pending."""
    expected, _ = _gradient_penalty_steps()
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        got, opt = _gradient_penalty_steps()
        state = auto_loss_scale.current_state()
        assert not auto_loss_scale._STATE["pending"].get(auto_loss_scale._graph_key())
    assert int(opt.iterations) == 2 and int(state.good_steps) == 2
    for have, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_each_apply_takes_the_finite_flag_of_its_own_gradients() -> None:
    """GAN order (both gradients, then both applies): the overflowing step is skipped, the
    finite one applied; a call never applied is not taken by either, nor scaled."""
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])
        opt_a, opt_b = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
        with tf.GradientTape(persistent=True) as tape:
            loss_a = tf.reduce_sum(a * a) * np.inf
            loss_b = tf.reduce_sum(b * b)
        logged = tape.gradient(loss_b, [b])  # never applied (say, logged)
        grads_a = tape.gradient(loss_a, [a])
        grads_b = tape.gradient(loss_b, [b])
        opt_a.apply_gradients(zip(grads_a, [a], strict=True))
        opt_b.apply_gradients(zip(grads_b, [b], strict=True))
        # Only the logged call is left, unscaled; the next call from its line replaces it.
        (left,) = auto_loss_scale._STATE["pending"][auto_loss_scale._graph_key()].values()
        assert [call.gradients for call in left] == [logged]
        assert left[0].site not in auto_loss_scale._STATE["eager_sites"]
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])
    np.testing.assert_allclose(b.numpy(), [2.4, 3.2], rtol=1e-6)


# ----------------------------------------------------------------------------- subprocesses


def _run(script: Path, tmp_path: Path, env: dict[str, str], timeout: float = 150) -> str:
    """Runs ``script`` as __main__ after processing the .pth as Python's startup does."""
    return _run_args(script, [], tmp_path, env, timeout)


def _run_args(
    script: Path, args: list[str], tmp_path: Path, env: dict[str, str], timeout: float = 150
) -> str:
    """:func:`_run` with command-line arguments for the script (``sys.argv[1:]``)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH.name).write_text(PTH.read_text())
    bootstrap = (
        "import runpy, site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    full_env = {k: v for k, v in os.environ.items() if k not in ALL_VARS}
    full_env.update(
        {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    )
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", bootstrap, str(site_dir), str(script), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{output[-4000:]}")
    return output


def _write(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def _half_ops_in_logs(log_dir: Path) -> set[str]:
    from tensorflow.core.framework import graph_pb2

    found: set[str] = set()
    for path in log_dir.glob("graphdef_AutoMixedPrecision_*.pb"):
        graph_def = graph_pb2.GraphDef()
        graph_def.ParseFromString(path.read_bytes())
        found |= half_ops(graph_def)
    return found


KERAS_FIT_SCRIPT = """
    import numpy as np, keras
    keras.utils.set_random_seed(0)
    x = np.random.rand(128, 8, 8, 1).astype("float32")
    y = x.reshape(128, -1)[:, :10].argmax(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    h = model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    print("optimizer:", type(model.optimizer).__name__)
    print("losses:", h.history["loss"])
    print("scale:", float(model.optimizer.loss_scale))
"""


def test_env_keras_fit_script_trains_in_mixed_precision(tmp_path: Path) -> None:
    script = _write(tmp_path, "fit.py", KERAS_FIT_SCRIPT)
    logs = tmp_path / "logs"
    out = _run(script, tmp_path, {ENV_ENABLE: "1", "TF_AMP_LOG_PATH": str(logs)})
    assert "optimizer: KerasLossScaleOptimizer" in out
    assert "Converted " in out and "scale: " in out
    assert {"Conv2D", "Conv2DBackpropFilter", "MatMul"} <= _half_ops_in_logs(logs)
    losses = eval(out.split("losses:")[1].splitlines()[0])  # noqa: S307 - our own output
    assert losses[-1] < losses[0]


def test_env_on_a_cpu_without_fast_16_bit_says_why_once(tmp_path: Path) -> None:
    """Where no reduced precision is fast (oneDNN off here, on any CPU) the activation keeps
    float32, changes nothing, and says why in one line, not once per layer of the runtime: a
    script that also calls enable_ (as examples/custom_loop.py does) gets no second line."""
    script = _write(
        tmp_path,
        "fp32.py",
        """
    import numpy as np, keras, tf_amp
    x = np.random.rand(64, 8).astype("float32"); y = x.sum(1)
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    plain.compile("adam", "mse")
    plain.fit(x, y, epochs=1, batch_size=32, verbose=0)
    print("plain:", type(plain.optimizer).__name__)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam()), "mse")
    h = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    print("losses:", len(h.history["loss"]), "scaling:", model.optimizer.enabled)
""",
    )
    out = _run(script, tmp_path, {ENV_ENABLE: "1", "TF_AMP_TARGET_DTYPE": "auto",
                                  "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert "plain: Adam" in out  # the script's own optimizer, untouched
    assert "losses: 2 scaling: False" in out
    assert "target float32" in out and "graph rewrite: off, loss scaling: off" in out
    assert out.count("tf_amp keeps float32") == 1, out


def test_env_conversion_line_is_printed_exactly_once(tmp_path: Path) -> None:
    """The package's own handler shows tf_amp's INFO lines; activation adds no second one."""
    script = _write(
        tmp_path,
        "once.py",
        """
        import tensorflow as tf

        @tf.function
        def square(x):
            return tf.matmul(x, x)

        print("sum:", float(tf.reduce_sum(square(tf.ones([4, 4])))))
        """,
    )
    out = _run(script, tmp_path, {ENV_ENABLE: "1"})
    assert "sum: 64.0" in out
    assert len([line for line in out.splitlines() if "Converted " in line]) == 1, out[-3000:]


def test_env_tf1_script_that_lists_its_devices_first(tmp_path: Path) -> None:
    # Listing the devices (for memory growth, say) starts TensorFlow's eager context before
    # the TF1 graph is built. The inner optimizer's slots were then made inside the
    # apply-or-skip cond and lifted to the eager context: "Attempting to capture an
    # EagerTensor without building a function".
    script = tmp_path / "devices_first.py"
    example = REPO / "examples" / "tf1_session_env.py"
    script.write_text(
        "import runpy, tensorflow as tf\n"
        "tf.config.list_physical_devices('GPU')\n"
        f"runpy.run_path({str(example)!r}, run_name='__main__')\n"
    )
    out = _run(script, tmp_path, {ENV_GRAPH_REWRITE: "1", ENV_LOSS_SCALING: "1"})
    assert "LossScaleMomentum/loss_scale_scale" in out
    assert float(out.split("test accuracy:")[1].split()[0]) > 0.9


TF1_ADAM_SCRIPT = """
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()  # the global graph, never entered with as_default()
    rng = np.random.default_rng(0)
    xs = rng.random((32, 4), dtype=np.float32); ys = xs.sum(1, keepdims=True)
    x = tf1.placeholder(tf.float32, [None, 4]); y = tf1.placeholder(tf.float32, [None, 1])
    w = tf1.get_variable("w", [4, 1], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.AdamOptimizer(0.05).minimize(loss, global_step=step)
    print("train ops in the graph:", all(
        op.graph is tf1.get_default_graph() for op in tf1.get_collection("train_op")))
    meta_graph = tf1.train.export_meta_graph()
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        first = sess.run(loss, {x: xs, y: ys})
        for _ in range(40):
            sess.run(train_op, {x: xs, y: ys})
        print("trained:", first, sess.run(loss, {x: xs, y: ys}), sess.run(step))
    with tf.Graph().as_default():
        tf1.train.import_meta_graph(meta_graph)
        print("meta graph imported")
"""


def test_env_tf1_adam_in_the_global_graph_trains_and_exports(tmp_path: Path) -> None:
    """An ordinary TF1 script: Adam's ``minimize`` in the implicit global graph failed under
    the environment ("Attempting to capture an EagerTensor without building a function"):
    the activation's device query makes the eager context before ``disable_eager_execution``,
    and Adam's ``beta1_power``, made inside the apply-or-skip cond, was lifted to it. And the
    meta graph of any v1 wrapper's step named an op of the cond's branch in ``train_op``, so
    ``import_meta_graph`` (a TF1 SavedModel's load too) raised a KeyError."""
    out = _run(_write(tmp_path, "adam.py", TF1_ADAM_SCRIPT), tmp_path, {ENV_ENABLE: "1"})
    assert "train ops in the graph: True" in out
    first, last, steps = (float(v) for v in out.split("trained:")[1].split()[:3])
    assert last < 0.1 * first and 30 <= steps <= 40  # the first overflows may be skipped
    assert "meta graph imported" in out


TF1_OWN_MIXED_PRECISION_SCRIPT = """
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    x = tf1.placeholder(tf.float32, [None, 4])
    w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.1))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
    step = tf1.train.get_or_create_global_step()
    opt = tf1.mixed_precision.enable_mixed_precision_graph_rewrite(
        tf1.train.MomentumOptimizer(0.05, 0.9))
    train_op = opt.minimize(loss, global_step=step)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(20):
            sess.run(train_op, {x: np.ones((4, 4), np.float32)})
        print("steps:", sess.run(step), "scale:", sess.run(opt._loss_scale()))
    print("tf_amp scales:", [v.op.name for v in tf1.global_variables()
                             if "loss_scale_scale" in v.op.name])
"""


def test_env_leaves_tf1s_own_loss_scale_optimizer_to_itself(tmp_path: Path) -> None:
    """TF1's ``enable_mixed_precision_graph_rewrite(opt)`` returns TensorFlow's
    ``MixedPrecisionLossScaleOptimizer``, which scales the loss itself; the environment
    wrapped it again, the two scales overflowed float16 and tf_amp's scale fell to its floor
    skipping the first 15 of 20 steps. (In the implicit global graph it also failed at
    ``minimize``, its cond's state lifted to the eager context the activation had made.)"""
    script = _write(tmp_path, "tf1_own.py", TF1_OWN_MIXED_PRECISION_SCRIPT)
    out = _run(script, tmp_path, {ENV_ENABLE: "1"})
    assert "steps: 20 scale: 32768.0" in out
    assert "tf_amp scales: []" in out


TF1_REFERENCE_VARIABLES_SCRIPT = """
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    x = tf1.placeholder(tf.float32, [None, 4])
    w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.1),
                         use_resource=False)
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
    train_op = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(10):
            sess.run(train_op, {x: np.ones((2, 4), np.float32)})
        print("loss:", sess.run(loss, {x: np.ones((2, 4), np.float32)}))
"""


def test_env_tf1_reference_variables_train(tmp_path: Path) -> None:
    """``use_resource=False``: the apply-or-skip cond (control flow v2 after
    ``disable_eager_execution()``) captured the reference variable by value, and Momentum's
    update failed to build ("expected float32_ref"). Such a cond is now built with TF1's
    control flow; the loss matches the same script without tf_amp."""
    script = _write(tmp_path, "ref_vars.py", TF1_REFERENCE_VARIABLES_SCRIPT)
    plain = float(_run(script, tmp_path, {}).split("loss:")[1].split()[0])
    mixed = float(_run(script, tmp_path, {ENV_ENABLE: "1"}).split("loss:")[1].split()[0])
    assert abs(mixed - plain) < 0.02 * plain + 1e-3, (mixed, plain)


TF1_META_GRAPH_SCRIPT = """
    import sys
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    xs = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    if sys.argv[1] == "save":
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 1], initializer=tf1.constant_initializer(0.1))
        loss = tf.identity(tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)), name="loss")
        train_op = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
        saver = tf1.train.Saver()
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(5):
                sess.run(train_op, {x: xs})
            saver.save(sess, "ckpt")
            print("saved loss:", sess.run(loss, {x: xs}))
    else:  # a new process: the graph comes from the meta graph alone
        saver = tf1.train.import_meta_graph("ckpt.meta")
        with tf1.Session() as sess:
            saver.restore(sess, "ckpt")
            print("restored loss:", sess.run("loss:0", {"x:0": xs}))
            for _ in range(5):
                sess.run(tf1.get_collection("train_op")[0], {"x:0": xs})
            print("trained loss:", sess.run("loss:0", {"x:0": xs}))
"""


def test_env_tf1_meta_graph_of_a_loss_scaled_run_loads_in_a_new_process(tmp_path: Path) -> None:
    """The meta graph a loss-scaled TF1 run writes holds the fused unscale op; a new process
    under the environment imported it before anything had loaded the op's library ("Op type
    not registered 'TfAmpUnscaleAndCheckFinite'"). The activation loads it."""
    script = _write(tmp_path, "meta.py", TF1_META_GRAPH_SCRIPT)
    saved = _run_args(script, ["save"], tmp_path, {ENV_ENABLE: "1"})
    loaded = _run_args(script, ["load"], tmp_path, {ENV_ENABLE: "1"})
    saved_loss = float(saved.split("saved loss:")[1].split()[0])
    assert float(loaded.split("restored loss:")[1].split()[0]) == saved_loss
    assert float(loaded.split("trained loss:")[1].split()[0]) < saved_loss


FIRST_IMPORT_SCRIPT = """
    import sys
    module = sys.argv[1]
    __import__(module)  # the script's first import: TensorFlow loads inside it
    import tf_amp
    session_class = tf_amp.Session
    import tensorflow as tf
    print("patched:", type(tf.function(lambda: 1)).__name__,
          tf.compat.v1.Session is session_class)
"""


@pytest.mark.parametrize("module", ["tf_amp.ops", "tf_amp.runtime.session"])
def test_env_a_tf_amp_module_imported_before_tensorflow(tmp_path: Path, module: str) -> None:
    """``import tf_amp.ops`` as a script's first import raised a circular-import error under
    the environment: TensorFlow finishes loading inside it, and the activation's patches,
    made right then, imported names ``tf_amp.ops`` had not defined yet. They now wait until
    that import is over."""
    script = _write(tmp_path, "first_import.py", FIRST_IMPORT_SCRIPT)
    out = _run_args(script, [module], tmp_path, {ENV_ENABLE: "1"})
    assert "patched: AmpTfFunction True" in out


def test_env_tf1_session_script_trains_in_mixed_precision(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    out = _run(
        REPO / "examples" / "tf1_session_env.py",
        tmp_path,
        {ENV_ENABLE: "1", "TF_AMP_LOG_PATH": str(logs)},
    )
    assert "session: tf_amp.runtime.session.Session" in out
    assert "LossScaleMomentum/loss_scale_scale" in out  # minimize() went through loss scaling
    assert {"Conv2D", "MatMul"} <= _half_ops_in_logs(logs)
    accuracy = float(out.split("test accuracy:")[1].split()[0])
    assert accuracy > 0.9


CUSTOM_LOOP_SCRIPT = """
    import numpy as np, tensorflow as tf, keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)
    x = np.random.rand(64, 16).astype("float32"); y = x.sum(1, keepdims=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step(x, y)) for _ in range(50)]
    print("first", losses[0], "last", losses[-1], "steps", int(opt.iterations))
    print("variables:", [v.name for v in tf.compat.v1.global_variables()] or "eager")
"""


def test_env_custom_loop_script_trains_in_mixed_precision(tmp_path: Path) -> None:
    script = _write(tmp_path, "loop.py", CUSTOM_LOOP_SCRIPT)
    logs = tmp_path / "logs"
    out = _run(script, tmp_path, {ENV_ENABLE: "1", "TF_AMP_LOG_PATH": str(logs)})
    assert "MatMul" in _half_ops_in_logs(logs)
    fields = out.split("first")[1].split()
    first, last, steps = float(fields[0]), float(fields[2]), int(fields[4])
    assert last < 0.5 * first
    assert 40 <= steps <= 50  # a few early steps may be skipped while the scale settles
    assert "loss scaling: on" in out


def test_env_rewrite_off_keeps_loss_scaling_only(tmp_path: Path) -> None:
    script = _write(tmp_path, "fit.py", KERAS_FIT_SCRIPT)
    logs = tmp_path / "logs"
    out = _run(
        script,
        tmp_path,
        {ENV_ENABLE: "1", ENV_GRAPH_REWRITE: "0", "TF_AMP_LOG_PATH": str(logs)},
    )
    assert "optimizer: KerasLossScaleOptimizer" in out
    assert "Converted " not in out and not list(logs.glob("*.pb"))


def test_env_garbage_value_fails_the_script_naming_the_variable(tmp_path: Path) -> None:
    script = _write(tmp_path, "s.py", "import tensorflow\nprint('ran')\n")
    with pytest.raises(AssertionError) as info:
        _run(script, tmp_path, {ENV_LOSS_SCALING: "sometimes"})
    assert ENV_LOSS_SCALING in str(info.value) and "ran" not in str(info.value)


def test_env_unset_imports_and_patches_nothing(tmp_path: Path) -> None:
    script = _write(
        tmp_path,
        "s.py",
        """
        import sys
        print("tf_amp modules:", sorted(m for m in sys.modules if m.startswith("tf_amp")))
        import tensorflow as tf
        print("tf.function patched:", tf.function.__module__.startswith("tf_amp"))
        print("Session:", tf.compat.v1.Session.__module__)
        """,
    )
    out = _run(script, tmp_path, {})
    assert "tf_amp modules: []" in out
    assert "tf.function patched: False" in out
    assert "Session: tensorflow.python.client.session" in out


def test_startup_line_costs_nothing_measurable_when_unset(monkeypatch) -> None:
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)
    line = PTH.read_text().strip()
    assert line.startswith("import ")  # site executes lines starting with "import"
    per_call = min(timeit.repeat(line, number=2000, repeat=3)) / 2000
    assert per_call < 50e-6  # microseconds, against an interpreter start of ~10-20 ms


def test_hook_install_copies_and_removes_the_pth(tmp_path: Path) -> None:
    from tf_amp.runtime import hook_install

    assert hook_install.main(["--site-dir", str(tmp_path)]) == 0
    installed = tmp_path / PTH.name
    assert installed.read_text() == PTH.read_text()
    assert hook_install.main(["--site-dir", str(tmp_path), "--remove"]) == 0
    assert not installed.exists()


def test_unmodified_custom_train_step_is_loss_scaled_correctly() -> None:
    """A Model subclass with its own float32 train_step (no scale_loss call) under the env."""

    class Regressor(keras.Model):
        def train_step(self, data):  # noqa: ANN001, ANN201 - an unmodified user train_step
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((self(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return {"loss": loss}

    with activation.activated():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        model = Regressor(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        assert not getattr(model.optimizer, "_tf_amp_loss_scale_wrapper", False)
        rng = np.random.default_rng(0)
        x = rng.random((64, 8), dtype=np.float32)
        y = x.sum(axis=1, keepdims=True)
        mse_before = float(np.mean((model.predict(x, verbose=0) - y) ** 2))
        before = auto_loss_scale.current_state()
        model.fit(x, y, batch_size=16, epochs=8, verbose=0)
        after = auto_loss_scale.current_state()
        mse_after = float(np.mean((model.predict(x, verbose=0) - y) ** 2))
    # Trained at the true gradient scale (a wrapper dividing by 2**15 would barely move).
    assert mse_after < 0.3 * mse_before
    steps = int(after.good_steps) + int(after.skipped_steps)
    assert steps - int(before.good_steps) - int(before.skipped_steps) == 32



class DelegatingRegressor(keras.Sequential):
    """A model with a ``train_step`` of its own that only hands over to Keras's."""

    def train_step(self, data):  # noqa: ANN001, ANN201 - an unmodified user train_step
        return super().train_step(data)


def _train_with_a_tiny_loss(model_class: type) -> tuple[np.ndarray, np.ndarray]:
    """The first kernel before and after SGD on 1e-8 times a regression's mse (learning rate
    1e6): in float16 its gradients underflow unless the loss is scaled; in float32 it trains
    as mse does with a learning rate of 0.01."""
    keras.utils.set_random_seed(1)
    model = model_class(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(1e6),
        loss=lambda y, p: keras.ops.mean(keras.ops.square(y - p), axis=-1) * 1e-8,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = x @ rng.normal(size=(8, 1)).astype(np.float32)
    before = model.layers[0].kernel.numpy()
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    return before, model.layers[0].kernel.numpy()


def test_a_train_step_that_calls_super_is_loss_scaled() -> None:
    """``super().train_step(data)`` from a step of the model's own: compile leaves such a
    model's optimizer unwrapped (its own step might not call ``scale_loss``), and Keras's step
    calls ``tape.gradient`` from Keras's code, which the patch took for library code. Nothing
    scaled the loss: every float16 gradient underflowed to 0 and the model never moved."""
    with activation.activated(Settings(True, True)):
        _, wrapped = _train_with_a_tiny_loss(keras.Sequential)
        made_by_the_wrapped_model = auto_loss_scale.made_any_state()
        before, delegating = _train_with_a_tiny_loss(DelegatingRegressor)
        state = auto_loss_scale.current_state()
    assert not made_by_the_wrapped_model  # Keras's wrapper scaled that loss, nothing else
    assert int(state.good_steps) == 12 and int(state.skipped_steps) == 0
    assert np.abs(delegating - before).sum() > 1.0  # moved (3.2; 0.0 before the fix)
    np.testing.assert_allclose(delegating, wrapped, rtol=1e-2, atol=1e-3)


def _regression_data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    return x, x.sum(axis=1, keepdims=True)


def test_compile_without_an_optimizer_under_the_activation() -> None:
    """``compile(optimizer=None)``, for a model that only evaluates, raised at ``compile``
    under the activation: the environment tried to wrap ``None``."""
    x, y = _regression_data()
    with activation.activated(Settings(True, True)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer=None, loss="mse")
        assert model.optimizer is None
        assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_an_optimizer_with_its_own_loss_scale_factor_keeps_it_under_the_activation() -> None:
    """An optimizer with Keras's ``loss_scale_factor`` raised at ``compile`` under the
    activation (the wrapper refuses it: the loss would be scaled twice). It is left as it is:
    the factor scales the loss, and nothing else does."""
    x, y = _regression_data()
    with activation.activated(Settings(True, True)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.05, loss_scale_factor=128.0)
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt
        first = model.evaluate(x, y, verbose=0)
        model.fit(x, y, batch_size=8, epochs=4, verbose=0)
        assert int(opt.iterations) == 16
        assert model.evaluate(x, y, verbose=0) < 0.5 * first
        assert not auto_loss_scale.made_any_state()  # no second scale made


class OwnStepWithNaNLoss(keras.Sequential):
    """Its own step, written for float32: a loss that is NaN on every step."""

    def train_step(self, data):  # noqa: ANN001, ANN201 - an unmodified user train_step
        x, _ = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.sqrt(self(x, training=True) - 1e9))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


def test_loss_scale_callback_says_the_floor_warnings_of_an_xla_step_of_the_environment(
    capfd, caplog, monkeypatch
) -> None:
    """Under XLA the environment's custom-loop scale counted no floor event, and the callback
    the trace recommends looked for ``check_skips`` on the model's (plain) optimizer only: 24
    steps were skipped at the floor without a word. Now it says both warnings."""
    import tf_amp
    from tf_amp import _say_once

    monkeypatch.setattr(_say_once, "_SAID", set())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype(np.float32)  # 24 steps: 15 to the floor, then 2 there
    with activation.activated(Settings(True, True)), caplog.at_level("WARNING", "tf_amp"):
        keras.utils.set_random_seed(0)
        model = OwnStepWithNaNLoss([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True)
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0,
                  callbacks=[tf_amp.LossScaleCallback()])
        state = auto_loss_scale.current_state()
    assert "compiled with XLA" in caplog.text
    assert int(state.skipped_steps) == 24 and int(model.optimizer.iterations) == 0
    said = [line for line in capfd.readouterr().err.splitlines()
            if line.startswith("WARNING tf_amp")]
    assert [line.split(" the loss scale ")[1][:16] for line in said] == [
        "fell to its floo", "is at its floor "
    ]


TF1_COMPUTE_APPLY_SCRIPT = """
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.set_random_seed(0)
    x = tf1.placeholder(tf.float32, [None, 8]); y = tf1.placeholder(tf.float32, [None, 1])
    factor = tf1.placeholder_with_default(1.0, [])
    w = tf1.get_variable("w", [8, 1], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2) * factor
    true_grad = tf.gradients(loss, [w])[0]  # plain tf.gradients: never loss-scaled
    step = tf1.train.get_or_create_global_step()
    opt = tf1.train.MomentumOptimizer(0.05, 0.9)
    grads_and_vars = opt.compute_gradients(loss)
    clipped = [(tf.clip_by_norm(g, 100.0), v) for g, v in grads_and_vars]
    train_op = opt.apply_gradients(clipped, global_step=step)
    scale = [v for v in tf1.global_variables() if v.name.endswith("loss_scale_scale:0")]
    print("scale variables:", [v.name for v in scale])
    rng = np.random.default_rng(0)
    xs = rng.random((32, 8), dtype=np.float32); ys = xs.sum(1, keepdims=True)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        first = sess.run(loss, {x: xs, y: ys})
        for _ in range(30):
            sess.run(train_op, {x: xs, y: ys})
        # Once the scale has settled below overflow, compute_gradients returns true gradients.
        g, tg = sess.run([grads_and_vars[0][0], true_grad], {x: xs, y: ys})
        print("grad ratio:", float(np.abs(g).sum() / np.abs(tg).sum()))
        before = sess.run([w, step, scale[0]])
        sess.run(train_op, {x: xs, y: ys, factor: np.inf})
        after = sess.run([w, step, scale[0]])
        print("trained:", first, sess.run(loss, {x: xs, y: ys}))
        print("w unchanged:", bool(np.array_equal(before[0], after[0])))
        print("steps:", before[1], after[1], "scales:", before[2], after[2])
"""


def test_env_tf1_compute_then_apply_gradients_is_loss_scaled(tmp_path: Path) -> None:
    """No minimize(): compute_gradients (clipped in between) then apply_gradients(global_step)."""
    out = _run(_write(tmp_path, "tf1.py", TF1_COMPUTE_APPLY_SCRIPT), tmp_path, {ENV_ENABLE: "1"})
    assert "LossScaleMomentum/loss_scale_scale:0" in out.split("scale variables:")[1].split("\n")[0]
    ratio = float(out.split("grad ratio:")[1].split()[0])
    assert abs(ratio - 1) < 1e-2  # unscaled: the true gradient, not 2**15 times it
    first, last = (float(v) for v in out.split("trained:")[1].split()[:2])
    assert last < 0.1 * first
    assert "w unchanged: True" in out
    fields = out.split("steps:")[1].split()
    assert fields[0] == fields[1]  # global_step did not move on the skipped step
    assert 25 <= int(fields[0]) < 30  # nor on the early overflows while the scale settled
    assert float(fields[4]) == float(fields[3]) / 2


TF1_OVERRIDE_SCRIPT = """
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()

    class ClippedGD(tf1.train.GradientDescentOptimizer):
        # Its own compute_gradients, taking only (loss, var_list, **kwargs) as TensorFlow's
        # minimize allows, clipping what super() returns.
        def compute_gradients(self, loss, var_list=None, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            grads_and_vars = super().compute_gradients(loss, var_list, **kwargs)
            return [(tf.clip_by_norm(g, 1.0), v) for g, v in grads_and_vars if g is not None]

    x = tf1.placeholder(tf.float32, [4, 2])
    factor = tf1.placeholder_with_default(1.0, [])
    w = tf1.get_variable("w", [2, 1], initializer=tf1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 3.0)) * factor
    opt = ClippedGD(0.5)
    train = opt.minimize(loss)
    print("override calls:", opt.calls)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        xs = np.ones((4, 2), np.float32)
        for _ in range(20):
            sess.run(train, {x: xs})
        before = sess.run(w)
        print("trained w:", *before.ravel())
        sess.run(train, {x: xs, factor: np.inf})  # float32: NaN weights; loss-scaled: skipped
        print("w unchanged:", bool(np.array_equal(before, sess.run(w))))
"""


def test_env_tf1_subclass_that_clips_in_its_compute_gradients_sees_true_gradients(
    tmp_path: Path,
) -> None:
    # Wrapped whole, the override clipped gradients times 2**15 and the wrapper then divided
    # them: updates 2**15 times too small (w 0.0008 for float32's 1.414). Its positional-only
    # call also failed: the wrapper passed six positional arguments.
    script = _write(tmp_path, "tf1_override.py", TF1_OVERRIDE_SCRIPT)
    plain = _run(script, tmp_path, {ENV_ENABLE: "0"})
    amp = _run(script, tmp_path, {ENV_ENABLE: "1", "TF_AMP_TARGET_DTYPE": "float16"})
    want = [float(v) for v in plain.split("trained w:")[1].split()[:2]]
    got = [float(v) for v in amp.split("trained w:")[1].split()[:2]]
    np.testing.assert_allclose(got, want, rtol=1e-2)
    assert "override calls: 1" in amp and "w unchanged: True" in amp


TF1_COMPAT_IMPORT_SCRIPT = """
    import numpy as np
    import tensorflow.compat.v1 as tf  # the idiom tf_upgrade_v2 recommends
    tf.disable_v2_behavior()
    x = tf.placeholder(tf.float32, [4, 8])
    w = tf.get_variable("w", [8, 8])
    y = tf.nn.relu(tf.matmul(x, w))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(y, {x: np.ones((4, 8), np.float32)})
        print("session:", type(sess).__module__)
    import tensorflow
    print("same class:", tensorflow.compat.v1.Session is tf.Session)
"""


def test_env_patches_a_script_that_imports_tensorflow_compat_v1(tmp_path: Path) -> None:
    # `import tensorflow.compat.v1 as tf` makes a second module object (and rebinds
    # tf.compat.v1 to it): patched on the first alone, the script ran a plain Session.
    out = _run(_write(tmp_path, "compat.py", TF1_COMPAT_IMPORT_SCRIPT), tmp_path,
               {ENV_ENABLE: "1", "TF_AMP_TARGET_DTYPE": "float16"})
    assert "session: tf_amp.runtime.session" in out and "same class: True" in out
    assert "Converted" in out


TF1_INTERACTIVE_AND_MONITORED_SCRIPT = """
    import sys
    import numpy as np, tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    rng = np.random.default_rng(0)
    xs = rng.random((32, 8), dtype=np.float32); ys = xs.sum(1, keepdims=True)

    def build():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8]); y = tf1.placeholder(tf.float32, [None, 1])
        w = tf1.get_variable("w", [8, 1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        step = tf1.train.get_or_create_global_step()
        train_op = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=step)
        return x, y, loss, step, train_op

    with tf.Graph().as_default():
        x, y, loss, step, train_op = build()
        sess = tf1.InteractiveSession()
        print("interactive:", type(sess).__module__, isinstance(sess, tf1.InteractiveSession))
        tf1.global_variables_initializer().run()
        first = loss.eval({x: xs, y: ys})
        for _ in range(30):
            train_op.run({x: xs, y: ys})
        print("interactive trained:", first, loss.eval({x: xs, y: ys}))
        sess.close()
        print("default after close:", tf1.get_default_session())

    class Probe(tf1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            print("monitored raw:", type(session).__module__)

    for last_step in (15, 30):  # the second run resumes from the checkpoint of the first
        with tf.Graph().as_default():
            x, y, loss, step, train_op = build()
            hooks = [tf1.train.StopAtStepHook(last_step=last_step), Probe()]
            with tf1.train.MonitoredTrainingSession(
                checkpoint_dir=sys.argv[1], hooks=hooks, save_summaries_steps=None,
                log_step_count_steps=None,
            ) as mon:
                print("resumed at:", mon.run(step))
                while not mon.should_stop():
                    _, value = mon.run([train_op, loss], {x: xs, y: ys})
            print("monitored loss:", value)
    ckpt = tf.train.latest_checkpoint(sys.argv[1])
    print("saved:", sorted(name for name, _ in tf.train.list_variables(ckpt)))
"""


def test_env_tf1_interactive_and_monitored_sessions_run_the_rewrite(tmp_path: Path) -> None:
    script = _write(tmp_path, "tf1.py", TF1_INTERACTIVE_AND_MONITORED_SCRIPT)
    logs = tmp_path / "logs"
    out = _run_args(
        script, [str(tmp_path / "ckpt")], tmp_path, {ENV_ENABLE: "1", "TF_AMP_LOG_PATH": str(logs)}
    )
    assert "interactive: tf_amp.runtime.session True" in out
    first, last = (float(v) for v in out.split("interactive trained:")[1].split()[:2])
    assert last < 0.1 * first
    assert "default after close: None" in out
    assert out.count("monitored raw: tf_amp.runtime.session") == 2
    resumed = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("resumed")]
    assert resumed[0] == 0 and 5 <= resumed[1] <= 15  # early overflow steps do not count
    assert "MatMul" in _half_ops_in_logs(logs)
    saved = out.split("saved:")[1]
    assert "LossScaleMomentum/loss_scale_scale" in saved  # the Saver of the hooks saves it


CUSTOM_LOOP_CHECKPOINT_SCRIPT = """
    import sys
    import numpy as np, tensorflow as tf, keras
    from tf_amp.runtime import auto_loss_scale  # only to print the state; training is unmodified
    ckpt_dir, phase = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.01)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=1)
    ckpt.restore(manager.latest_checkpoint)  # nothing on the first run; deferred otherwise
    x = np.random.rand(32, 8).astype("float32"); y = x.sum(1, keepdims=True)

    @tf.function
    def step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2) * factor
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    if phase == "first":
        for _ in range(5):
            step(tf.constant(1.0))
        step(tf.constant(np.inf))  # an overflow: the scale halves, good_steps restarts
        for _ in range(7):
            step(tf.constant(1.0))
    else:
        for _ in range(3):
            step(tf.constant(1.0))
    state = auto_loss_scale.current_state()
    print("state:", float(state.scale), int(state.good_steps), int(state.skipped_steps))
    print("saved:", manager.save())
"""


def test_env_custom_loop_checkpoint_resumes_the_loss_scale_schedule(tmp_path: Path) -> None:
    """tf.train.Checkpoint(optimizer=opt) carries the env-mode scale; a new process resumes it."""
    script = _write(tmp_path, "loop.py", CUSTOM_LOOP_CHECKPOINT_SCRIPT)
    ckpt_dir = str(tmp_path / "ckpt")
    first = _run_args(script, [ckpt_dir, "first"], tmp_path, {ENV_ENABLE: "1"})
    scale, good, skipped = first.split("state:")[1].split()[:3]
    assert float(scale) < 2.0**15 and int(good) == 7 and int(skipped) >= 1
    saved = first.split("saved:")[1].split()[0]
    names = {name for name, _ in tf.train.list_variables(saved)}
    assert f"optimizer/{auto_loss_scale.STATE_NAME}_scale/.ATTRIBUTES/VARIABLE_VALUE" in names
    second = _run_args(script, [ckpt_dir, "resume"], tmp_path, {ENV_ENABLE: "1"})
    assert second.split("state:")[1].split()[:3] == [scale, "10", skipped]


def test_env_v1_optimizer_checkpoint_carries_its_loss_scale(tmp_path: Path) -> None:
    """Eager v1 optimizer: tf.train.Checkpoint(optimizer=opt) saves and restores the scale of
    the wrapper the activation put around it, restored before its first scaled loss."""

    def train(opt: Any, var: tf.Variable, factor: float) -> None:
        grads_and_vars = opt.compute_gradients(lambda: tf.reduce_sum(var * var) * factor, [var])
        opt.apply_gradients(grads_and_vars)

    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        var = tf.Variable([1.0, 2.0])
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        train(opt, var, float("inf"))  # overflow: 2**15 -> 2**14
        train(opt, var, 1.0)
        wrapper = auto_loss_scale.v1_wrapper_of(opt)
        assert float(wrapper.loss_scale) == 2.0**14
        path = tf.train.Checkpoint(optimizer=opt, var=var).save(str(tmp_path / "ckpt"))

        var2 = tf.Variable([0.0, 0.0])
        opt2 = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        tf.train.Checkpoint(optimizer=opt2, var=var2).restore(path)
        train(opt2, var2, 1.0)
        state = auto_loss_scale.v1_wrapper_of(opt2)._state()  # noqa: SLF001
    assert float(state.scale) == 2.0**14
    assert int(state.good_steps) == 2 and int(state.skipped_steps) == 1


def test_env_fit_checkpoint_of_the_users_optimizer_carries_the_wrapper_scale(
    tmp_path: Path,
) -> None:
    """compile() wrapped `opt`; tf.train.Checkpoint(optimizer=opt) still saves the scale, and a
    fresh model and optimizer restored before fit() continue from it."""

    def compiled() -> tuple[keras.Model, keras.optimizers.Optimizer]:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.01)
        model.compile(opt, "mse")
        return model, opt

    x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        model, opt = compiled()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.optimizer.loss_scale = 1024.0  # a scale the schedule would not reach by itself
        path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
        model2, opt2 = compiled()
        tf.train.Checkpoint(optimizer=opt2).restore(path)
        model2.fit(x, y, batch_size=16, epochs=1, verbose=0)
        state = model2.optimizer._state()  # noqa: SLF001
    assert float(state.scale) == 1024.0
    assert int(state.good_steps) == 4  # 2 steps saved + 2 after the restore


def test_env_keras_file_loads_compiled_with_its_loss_scale(tmp_path: Path) -> None:
    """load_model under the env compiles the loaded model (the compile patch must not look like
    a user's custom compile to Keras) and restores the wrapper's scale from the file."""
    x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.optimizer.loss_scale = 1024.0
        model.save(tmp_path / "m.keras")
        loaded = keras.models.load_model(tmp_path / "m.keras")
        assert getattr(loaded.optimizer, "_tf_amp_loss_scale_wrapper", False)
        assert float(loaded.optimizer.loss_scale) == 1024.0
        assert int(loaded.optimizer.iterations) == 2


def test_env_and_float32_keras_files_are_interchangeable(tmp_path: Path) -> None:
    """A .keras file saved under the env loads as the script's own optimizer without it, and a
    float32 file loads under the env with its optimizer state (moments, iterations) kept."""
    x = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)

    def trained() -> keras.Model:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        return model

    def adam_state(optimizer: keras.optimizers.Optimizer) -> list[np.ndarray]:
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        return [v.numpy() for v in inner.variables]

    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        amp_model = trained()
        amp_model.save(tmp_path / "amp.keras")
    loaded = keras.models.load_model(tmp_path / "amp.keras")  # no activation: plain Keras
    assert type(loaded.optimizer) is keras.optimizers.Adam
    assert int(loaded.optimizer.iterations) == 4
    for got, want in zip(adam_state(loaded.optimizer), adam_state(amp_model.optimizer),
                         strict=True):
        np.testing.assert_array_equal(got, want)

    float32_model = trained()
    float32_model.save(tmp_path / "f32.keras")
    with activation.activated(Settings(graph_rewrite=False, loss_scaling=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "Skipping variable loading" for the inner one
            resumed = keras.models.load_model(tmp_path / "f32.keras")
        assert getattr(resumed.optimizer, "_tf_amp_loss_scale_wrapper", False)
        assert int(resumed.optimizer.iterations) == 4
        for got, want in zip(adam_state(resumed.optimizer), adam_state(float32_model.optimizer),
                             strict=True):
            np.testing.assert_array_equal(got, want)
        resumed.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert int(resumed.optimizer.iterations) == 6



TF1_FLOAT32_CHECKPOINT_SCRIPT = """
    import sys
    import numpy as np, tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf1 = tf.compat.v1
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(64, 8)).astype("float32"); ys = (xs[:, :1] > 0).astype("float32")
    x = tf1.placeholder(tf.float32, [None, 8]); y = tf1.placeholder(tf.float32, [None, 1])
    w = tf1.get_variable("w", [8, 1], initializer=tf1.zeros_initializer())
    logits = tf.matmul(x, w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
    saver = tf1.train.Saver()
    with tf1.Session() as sess:
        if sys.argv[2] == "save":
            sess.run(tf1.global_variables_initializer())
            for _ in range(5):
                sess.run(train_op, {x: xs, y: ys})
            saver.save(sess, sys.argv[1])
        else:
            saver.restore(sess, sys.argv[1])
            print("w:", sess.run(w).ravel().tolist())
            sess.run(train_op, {x: xs, y: ys})
            saver.save(sess, sys.argv[1] + "_amp")
            saver.restore(sess, sys.argv[1] + "_amp")  # an AMP checkpoint restores its state
        print("trained w:", sess.run(w).ravel().tolist())
"""


def test_env_tf1_saver_restores_a_float32_checkpoint(tmp_path: Path) -> None:
    """Fine-tuning / resuming float32 training with the env on: Saver.restore of a checkpoint
    without the loss-scale variables restores the rest instead of failing on a missing key."""
    script = _write(tmp_path, "tf1.py", TF1_FLOAT32_CHECKPOINT_SCRIPT)
    ckpt = str(tmp_path / "ckpt" / "model")
    saved = _run_args(script, [ckpt, "save"], tmp_path, {})
    resumed = _run_args(script, [ckpt, "restore"], tmp_path, {ENV_ENABLE: "1"})
    assert "has no loss-scale state" in resumed

    def printed(out: str, label: str) -> np.ndarray:
        line = next(line for line in out.splitlines() if line.startswith(label))
        return np.array([float(v) for v in line[len(label):].strip(" []").split(",")])

    w_saved = printed(saved, "trained w:")
    np.testing.assert_array_equal(printed(resumed, "w:"), w_saved)  # restored exactly
    assert not np.array_equal(printed(resumed, "trained w:"), w_saved)  # and trains on
    amp_names = {name for name, _ in tf.train.list_variables(ckpt + "_amp")}
    assert any(name.endswith("loss_scale_scale") for name in amp_names)


TF1_OPTIMIZER_VARIABLES_SCRIPT = """
import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_eager_execution()
step = tf.train.get_or_create_global_step()
w = tf.get_variable("w", [3, 1], initializer=tf.ones_initializer())
loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones([4, 3]), w) - 1.0))
opt = tf.train.AdamOptimizer(0.1)
train = opt.minimize(loss, global_step=step)
other = tf.train.GradientDescentOptimizer(0.1)
plain = other.apply_gradients(zip(tf.gradients(loss, [w]), [w]))  # the BERT recipe
with tf.Session() as sess:
    sess.run(tf.variables_initializer([w, step]))
    sess.run(tf.variables_initializer(opt.variables()))  # a fresh optimizer state
    for _ in range(3):
        sess.run(train)
    print("names:", sorted(v.op.name.split("/")[-1] for v in opt.variables()))
    print("steps:", sess.run(step))
"""


def test_env_tf1_optimizer_variables_hold_the_loss_scale_state(tmp_path: Path) -> None:
    """``opt.variables()`` left out the state of the wrapper the environment put around the
    optimizer: initializing (or saving) an optimizer by its variables left it uninitialized,
    and the next step failed. And ``tf.gradients`` + ``apply_gradients``, which tf_amp cannot
    scale, says so."""
    script = _write(tmp_path, "tf1.py", TF1_OPTIMIZER_VARIABLES_SCRIPT)
    out = _run(script, tmp_path, {ENV_ENABLE: "1"})
    assert "loss_scale_scale" in out.split("names:")[1].splitlines()[0]
    assert 1 <= int(out.split("steps:")[1].split()[0]) <= 3  # a step may skip at 2**15
    assert "GradientDescentOptimizer.apply_gradients() got gradients that tf_amp did not" in out
    assert "AdamOptimizer.apply_gradients() got gradients" not in out
