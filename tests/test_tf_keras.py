"""tf_keras (Keras 2): the loss-scale wrappers, ``fit`` through the rewrite, saving, policies.

Real tf_keras models: a CNN with BatchNormalization, a model with its own ``train_step``, and an
Embedding model (sparse gradients), each with a current and a legacy tf_keras optimizer.
Evidence of mixed precision is the dtype of the ops in the rewritten functions that ran.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

tf_keras = pytest.importorskip(
    "tf_keras", reason="tf_keras is not installed (pip install --no-deps 'tf-keras==2.21.*')"
)

import tf_amp  # noqa: E402
from tests.e2e_helpers import half_ops_of_functions, module_with_an_xla_step  # noqa: E402
from tf_amp.enable import optimizer_wants_rewrite  # noqa: E402
from tf_amp.loss_scale import DynamicLossScale  # noqa: E402
from tf_amp.optimizers.tf_keras import (  # noqa: E402
    TfKerasLegacyLossScaleOptimizer,
    TfKerasLossScaleOptimizer,
)
from tf_amp.runtime import tf_keras_fit  # noqa: E402

KINDS = ["current", "legacy"]
CONV_OPS = {"Conv2D", "Conv2DBackpropFilter", "FusedBatchNormV3", "FusedBatchNormGradV3", "MatMul"}


def _adam(kind: str, lr: float = 1e-2) -> Any:
    if kind == "legacy":
        return tf_keras.optimizers.legacy.Adam(lr)
    return tf_keras.optimizers.Adam(lr)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((128, 8, 8, 1), dtype=np.float32)
    y = x.reshape(128, -1)[:, :10].argmax(1).astype(np.int32)
    return x, y


def _cnn() -> Any:
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential(
        [
            tf_keras.Input((8, 8, 1)),
            tf_keras.layers.Conv2D(8, 3),
            tf_keras.layers.BatchNormalization(),
            tf_keras.layers.ReLU(),
            tf_keras.layers.Flatten(),
            tf_keras.layers.Dense(10),
        ]
    )


def _tokens() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 50, size=(128, 6)).astype(np.int32)
    return tokens, (np.sum(tokens < 25, axis=1) > 3).astype(np.int32)


def _embedding_model() -> Any:
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential(
        [
            tf_keras.Input((6,), dtype="int32"),
            tf_keras.layers.Embedding(50, 16),
            tf_keras.layers.GlobalAveragePooling1D(),
            tf_keras.layers.Dense(16, activation="relu"),
            tf_keras.layers.Dense(2),
        ]
    )


def _optimizer_variables(opt: Any) -> list[Any]:
    variables = opt.variables
    return list(variables() if callable(variables) else variables)


def _snapshot(model: Any, opt: Any) -> list[bytes]:
    """Trainable weights, slots and ``iterations``: what a step applies. (BatchNormalization's
    moving statistics are updated by the forward pass itself, skipped step or not, as in
    tf_keras's own wrapper.)"""
    return [v.numpy().tobytes() for v in model.trainable_weights + _optimizer_variables(opt)]


SCCE = dict(from_logits=True)


# ------------------------------------------------------------------------- the wrappers


@pytest.mark.parametrize("kind", KINDS)
def test_wrapper_is_a_tf_keras_loss_scale_optimizer_of_the_inner_kind(kind: str) -> None:
    opt = tf_amp.LossScaleOptimizer(_adam(kind), dynamic=True, initial_scale=256.0)
    expected = TfKerasLegacyLossScaleOptimizer if kind == "legacy" else TfKerasLossScaleOptimizer
    assert type(opt) is expected
    assert isinstance(opt, tf_amp.LossScaleOptimizer)
    # tf_keras's compile under mixed_float16 sees a loss-scale optimizer and adds none
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
    assert float(opt.loss_scale) == 256.0 and opt.dynamic and opt.dynamic_growth_steps == 2000
    assert opt.learning_rate is opt.inner_optimizer.learning_rate or float(
        opt.learning_rate
    ) == pytest.approx(1e-2)
    with pytest.raises(ValueError, match="already wrapped"):
        tf_amp.LossScaleOptimizer(opt.inner_optimizer)
    with pytest.raises(ValueError, match="inner_optimizer"):
        tf_amp.LossScaleOptimizer(tf_keras.mixed_precision.LossScaleOptimizer(_adam(kind)))
    static = tf_amp.LossScaleOptimizer(_adam(kind), dynamic=False, initial_scale=8.0)
    assert not static.dynamic and static.dynamic_counter is None


@pytest.mark.parametrize("kind", KINDS)
def test_custom_loop_api_trains_in_half_and_skips_inf_nan_bit_identically(kind: str) -> None:
    model, (x, y) = _cnn(), _digits()
    opt = tf_amp.LossScaleOptimizer(_adam(kind), DynamicLossScale(2.0**10, growth_interval=1000))
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(**SCCE)

    @tf_amp.function
    def step(x: tf.Tensor, y: tf.Tensor, poison: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * (1.0 + poison)
            scaled = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    losses = [float(step(x, y, tf.constant(0.0))) for _ in range(15)]
    assert losses[-1] < 0.8 * losses[0]
    assert half_ops_of_functions(step.rewritten_concrete_functions()) >= CONV_OPS
    # the fused native op unscales every gradient in one call
    graph = step.rewritten_concrete_functions()[0].graph.as_graph_def()
    op_types = {n.op for n in graph.node} | {
        n.op for f in graph.library.function for n in f.node_def
    }
    assert "TfAmpUnscaleAndCheckFinite" in op_types
    assert int(opt.iterations) == 15
    for bad in (float("inf"), float("nan")):
        before, scale = _snapshot(model, opt), float(opt.loss_scale)
        step(x, y, tf.constant(bad))
        assert _snapshot(model, opt) == before  # weights, slots, iterations
        assert float(opt.loss_scale) == scale / 2
    assert int(opt.skipped_steps) == 2 and int(opt.iterations) == 15


@pytest.mark.parametrize("kind", KINDS)
def test_every_apply_writes_its_summaries_at_a_step_of_its_own(kind: str, tmp_path: Path) -> None:
    """As the Keras 3 wrapper: a skipped step no longer repeats the applied step's step."""
    w = tf.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(_adam(kind), DynamicLossScale(8.0))

    @tf.function
    def apply(grad: tf.Tensor) -> None:
        opt.apply_gradients([(grad, w)])

    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for grad in ([1.0], [np.inf], [1.0], [np.inf], [1.0]):
            apply(tf.constant(grad) * opt.loss_scale)
    writer.flush()
    steps = [
        event.step
        for name in sorted(p.name for p in tmp_path.iterdir())
        for event in tf.compat.v1.train.summary_iterator(str(tmp_path / name))
        for value in event.summary.value
        if value.tag == "tf_amp/skipped_steps"
    ]
    assert steps == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kind", KINDS)
def test_embedding_sparse_gradients_are_unscaled_and_skipped(kind: str) -> None:
    model, (x, y) = _embedding_model(), _tokens()
    opt = tf_amp.LossScaleOptimizer(_adam(kind))
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(**SCCE)

    @tf_amp.function
    def step(x: tf.Tensor, y: tf.Tensor, poison: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * (1.0 + poison)
            scaled = opt.get_scaled_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        # apply_gradients unscales: one fused op
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    x, y = tf.constant(x), tf.constant(y)
    with tf.GradientTape() as tape:
        probe = tf.reduce_sum(model(x))
    assert isinstance(tape.gradient(probe, model.trainable_variables)[0], tf.IndexedSlices)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # get_scaled_loss was called: no "never scaled" warning
        losses = [float(step(x, y, tf.constant(0.0))) for _ in range(30)]
    assert losses[-1] < 0.8 * losses[0]
    assert "MatMul" in half_ops_of_functions(step.rewritten_concrete_functions())
    before = _snapshot(model, opt)
    step(x, y, tf.constant(float("nan")))
    assert _snapshot(model, opt) == before and int(opt.skipped_steps) == 1


def test_gradients_never_scaled_warn_as_tf_keras_did() -> None:
    var = tf.Variable([1.0, 2.0])
    opt = tf_amp.LossScaleOptimizer(tf_keras.optimizers.SGD(1.0), loss_scale=4.0)
    with pytest.warns(UserWarning, match="get_scaled_loss"):
        opt.apply_gradients([(tf.constant([4.0, 8.0]), var)])
    np.testing.assert_allclose(var.numpy(), [0.0, 0.0])  # divided by the scale: 1 and 2


# --------------------------------------------------------------------------------- fit


@pytest.mark.parametrize("kind", KINDS)
def test_fit_of_a_cnn_with_batchnorm_runs_the_rewritten_step(kind: str) -> None:
    model, (x, y) = _cnn(), _digits()
    model.compile(
        tf_amp.enable_mixed_precision_graph_rewrite(_adam(kind)),
        tf_keras.losses.SparseCategoricalCrossentropy(**SCCE),
        metrics=["accuracy"],
    )
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    functions = tf_keras_fit.rewritten_functions(model)
    assert half_ops_of_functions(functions["train"].rewritten_concrete_functions()) >= CONV_OPS
    model.evaluate(x, y, verbose=0)
    predictions = model.predict(x[:8], verbose=0)
    assert predictions.dtype == np.float32
    functions = tf_keras_fit.rewritten_functions(model)
    predict = functions["predict"].rewritten_concrete_functions()
    assert {"Conv2D", "MatMul"} <= half_ops_of_functions(predict)
    assert "Conv2D" in half_ops_of_functions(functions["test"].rewritten_concrete_functions())
    # a plain optimizer on recompile: float32 again
    model.compile(_adam(kind), tf_keras.losses.SparseCategoricalCrossentropy(**SCCE))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert not isinstance(model.train_function, tf_amp.runtime.function.Function)


class _OwnStep(tf_keras.Model):
    """A Keras 2 custom train_step in the tf.keras 2.x mixed-precision guide's form."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = tf_keras.layers.Conv2D(8, 3, activation="relu")
        self.flat = tf_keras.layers.Flatten()
        self.out = tf_keras.layers.Dense(10)
        self.tracker = tf_keras.metrics.Mean(name="loss")

    def call(self, x: Any, training: bool = False) -> Any:
        return self.out(self.flat(self.conv(x)))

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
            scaled = self.optimizer.get_scaled_loss(loss)
        grads = self.optimizer.get_unscaled_gradients(
            tape.gradient(scaled, self.trainable_variables)
        )
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    @property
    def metrics(self) -> list[Any]:
        return [self.tracker]


@pytest.mark.parametrize("kind", KINDS)
def test_fit_with_a_custom_train_step_runs_rewritten_and_loss_scaled(kind: str) -> None:
    tf_keras.utils.set_random_seed(0)
    model, (x, y) = _OwnStep(), _digits()
    opt = tf_amp.enable_mixed_precision_graph_rewrite(_adam(kind))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(**SCCE))
    losses = model.fit(x, y, batch_size=32, epochs=8, verbose=0).history["loss"]
    assert losses[-1] < 0.8 * losses[0]
    functions = tf_keras_fit.rewritten_functions(model)
    assert {"Conv2D", "Conv2DBackpropFilter", "MatMul"} <= half_ops_of_functions(
        functions["train"].rewritten_concrete_functions()
    )
    assert int(opt.iterations) == 32 and float(opt.loss_scale) == 2.0**15


@pytest.mark.parametrize("kind", KINDS)
def test_fit_of_an_embedding_model_with_steps_per_execution(kind: str) -> None:
    model, (x, y) = _embedding_model(), _tokens()
    model.compile(
        tf_amp.enable_mixed_precision_graph_rewrite(_adam(kind)),
        tf_keras.losses.SparseCategoricalCrossentropy(**SCCE),
        steps_per_execution=2,
    )
    losses = model.fit(x, y, batch_size=16, epochs=6, verbose=0).history["loss"]
    assert losses[-1] < 0.8 * losses[0]
    functions = tf_keras_fit.rewritten_functions(model)
    assert "MatMul" in half_ops_of_functions(functions["train"].rewritten_concrete_functions())
    assert int(model.optimizer.iterations) == 48


def test_disable_restores_tf_keras_builders() -> None:
    original = vars(tf_keras.Model)["make_train_function"]
    tf_amp.enable_mixed_precision_graph_rewrite(tf_keras.optimizers.SGD())
    assert vars(tf_keras.Model)["make_train_function"] is not original
    tf_amp.disable_mixed_precision_graph_rewrite()
    assert vars(tf_keras.Model)["make_train_function"] is original
    assert tf_keras_fit.held() == 0


# ------------------------------------------------------------------------ checkpoints


def _train_a_few_steps(model: Any, opt: Any, steps: int = 3) -> None:
    x, y = _digits()
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(**SCCE)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(loss_fn(y, model(x, training=True)))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_precision_checkpoint_restores_into_float32_and_back(
    kind: str, tmp_path: Path
) -> None:
    mixed_model = _cnn()
    mixed = tf_amp.LossScaleOptimizer(_adam(kind), DynamicLossScale(2.0**12, growth_interval=2))
    _train_a_few_steps(mixed_model, mixed)
    assert float(mixed.loss_scale) == 2.0**13  # grew once: the state is not the initial one
    path = tf.train.Checkpoint(model=mixed_model, optimizer=mixed).save(str(tmp_path / "mixed"))

    plain_model, plain = _cnn(), _adam(kind)
    _train_a_few_steps(plain_model, tf_amp.LossScaleOptimizer(plain, enabled=False), steps=1)
    tf.train.Checkpoint(model=plain_model, optimizer=plain).restore(path).expect_partial()
    assert _snapshot(plain_model, plain) == _snapshot(mixed_model, mixed)

    _train_a_few_steps(plain_model, tf_amp.LossScaleOptimizer(_adam(kind), enabled=False), 1)
    back_path = tf.train.Checkpoint(model=plain_model, optimizer=plain).save(
        str(tmp_path / "float32")
    )
    back_model = _cnn()
    back = tf_amp.LossScaleOptimizer(_adam(kind))
    _train_a_few_steps(back_model, back, steps=1)
    tf.train.Checkpoint(model=back_model, optimizer=back).restore(back_path).assert_consumed()
    assert _snapshot(back_model, back) == _snapshot(plain_model, plain)

    # and a wrapper resumes the schedule from a mixed checkpoint, restored before its first step
    resumed = tf_amp.LossScaleOptimizer(_adam(kind), DynamicLossScale(2.0**12, growth_interval=2))
    tf.train.Checkpoint(model=_cnn(), optimizer=resumed).restore(path).expect_partial()
    assert float(resumed.loss_scale) == 2.0**13


def test_tf_keras_own_loss_scale_checkpoint_restores_its_scale(tmp_path: Path) -> None:
    theirs = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.Adam())
    model = _cnn()
    _train_a_few_steps(model, theirs, steps=1)
    theirs.loss_scale  # noqa: B018 - the property works
    theirs._loss_scale._current_loss_scale.assign(64.0)  # noqa: SLF001
    path = tf.train.Checkpoint(optimizer=theirs).save(str(tmp_path / "theirs"))
    ours = tf_amp.LossScaleOptimizer(tf_keras.optimizers.Adam())
    tf.train.Checkpoint(optimizer=ours).restore(path).expect_partial()
    assert float(ours.loss_scale) == 64.0


# Where tf_keras restores the optimizer's state on load_model (measured for a plain optimizer):
# .keras and .h5 for current optimizers, .h5 for legacy ones. tf_keras's own LossScaleOptimizer
# of a current optimizer drops it from .h5 ("Error in loading the saved optimizer state"); the
# wrapper does not. Elsewhere the optimizer starts afresh (weights and config load everywhere).
STATE_RESTORED = {("current", "keras"), ("current", "h5"), ("legacy", "h5")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["keras", "h5", "tf"])
def test_model_save_round_trip(kind: str, fmt: str, tmp_path: Path) -> None:
    model, (x, y) = _cnn(), _digits()
    opt = tf_amp.enable_mixed_precision_graph_rewrite(_adam(kind), loss_scale=DynamicLossScale())
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(**SCCE))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    opt.set_loss_scale(1024.0)
    path = str(tmp_path / ("model" if fmt == "tf" else f"model.{fmt}"))
    model.save(path, save_format=None if fmt != "tf" else "tf")
    loaded = tf_keras.models.load_model(path)
    assert type(loaded.optimizer) is type(opt)
    assert optimizer_wants_rewrite(loaded.optimizer)  # the resumed run is rewritten too
    for a, b in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert loaded.optimizer.loss_scale_policy == opt.loss_scale_policy
    if (kind, fmt) in STATE_RESTORED:
        assert int(loaded.optimizer.iterations) == int(opt.iterations) > 0
        slots = _optimizer_variables(opt.inner_optimizer)
        for a, b in zip(_optimizer_variables(loaded.optimizer), slots, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    loaded.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert "train" in tf_keras_fit.rewritten_functions(loaded)


LOAD_IN_A_FRESH_PROCESS = """
import sys
first = sys.argv[2]
if first == "tf_amp":
    import tf_amp
import tensorflow as tf
import tf_keras
if first != "tf_amp":
    import tf_amp
print(type(tf_keras.models.load_model(sys.argv[1]).optimizer).__name__)
"""


@pytest.mark.parametrize("fmt", ["h5", "tf"])
def test_a_saved_model_loads_where_only_tf_amp_is_imported(fmt: str, tmp_path: Path) -> None:
    """tf_keras's .h5 and SavedModel files name the wrapper by its registered name; it was
    registered only once a tf_keras wrapper had been made in the process, so a fresh one
    failed with "Unknown optimizer: 'tf_amp>TfKerasLossScaleOptimizer'"."""
    import os
    import subprocess
    import sys

    model = _cnn()
    model.compile(tf_amp.enable_mixed_precision_graph_rewrite(_adam("current")), "mse")
    path = str(tmp_path / ("model" if fmt == "tf" else "model.h5"))
    model.save(path, save_format="tf" if fmt == "tf" else None)
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    for first in ("tf_amp", "tf_keras"):
        done = subprocess.run([sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, path, first],
                              env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[-1] == "TfKerasLossScaleOptimizer"


def test_from_config_gives_the_tf_keras_wrapper_in_the_tf_keras_world(monkeypatch) -> None:
    """A legacy inner optimizer (Keras 3 cannot build one), or TF_USE_LEGACY_KERAS=1, makes
    the factory's from_config a tf_keras wrapper; it gave a Keras 3 one, which tf_keras's
    compile refused."""
    legacy = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.legacy.SGD(0.1))
    assert type(tf_amp.LossScaleOptimizer.from_config(legacy.get_config())) is (
        TfKerasLegacyLossScaleOptimizer)
    current = tf_amp.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1)).get_config()
    assert type(tf_amp.LossScaleOptimizer.from_config(current)).__name__ == (
        "KerasLossScaleOptimizer")  # tf.keras 2.x configs migrate to Keras 3 by default
    from tf_amp.optimizers import _tf_keras_family

    keras3 = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1)).get_config()
    no_module = dict(keras3, inner_optimizer=dict(keras3["inner_optimizer"], module=None,
                                                  config=None))
    assert _tf_keras_family(no_module) is None  # an AttributeError at first
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert type(tf_amp.LossScaleOptimizer.from_config(current)) is TfKerasLossScaleOptimizer
    assert {"tf_amp>TfKerasLossScaleOptimizer", "tf_amp>TfKerasLegacyLossScaleOptimizer"} <= set(
        tf_amp.custom_objects())
    # A Keras 3 optimizer's config stays Keras 3 there (its own keys say so).
    assert type(tf_amp.LossScaleOptimizer.from_config(keras3)).__name__ == (
        "KerasLossScaleOptimizer")


# -------------------------------------------------------------- tf_keras's mixed policy


def test_mixed_float16_policy_cooperates_with_one_loss_scale() -> None:
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, (x, y) = _cnn(), _digits()
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
    opt = tf_amp.enable_mixed_precision_graph_rewrite(tf_keras.optimizers.Adam(1e-2))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(**SCCE))
    assert model.optimizer is opt  # tf_keras did not wrap it in its own loss scale
    losses = model.fit(x, y, batch_size=32, epochs=4, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    assert model.predict(x[:4], verbose=0).dtype == np.float16  # the policy's own output dtype
    functions = tf_keras_fit.rewritten_functions(model)
    train = functions["train"].rewritten_concrete_functions()
    assert {"Conv2D", "MatMul"} <= half_ops_of_functions(train)


def _tf_keras_loss_scale_wrappers() -> tuple[type, type]:
    from tf_keras.src.mixed_precision import loss_scale_optimizer

    return loss_scale_optimizer.LossScaleOptimizerV3, loss_scale_optimizer.LossScaleOptimizer


def test_env_activation_patches_tf_keras_and_restores_it_exactly() -> None:
    from tf_amp._upstream.tf_keras import save_model_owners
    from tf_amp.runtime import activation

    owners = [
        (tf_keras.Model, "compile"),
        (tf_keras.Model, "make_train_function"),
        (tf_keras.Model, "make_test_function"),
        (tf_keras.Model, "make_predict_function"),
        (tf_keras.optimizers.Optimizer, "apply_gradients"),
        (tf_keras.optimizers.legacy.Optimizer, "apply_gradients"),
        # tf_keras's own wrappers (current and legacy optimizers) mark the loss they scale
        *((wrapper, "get_scaled_loss") for wrapper in _tf_keras_loss_scale_wrappers()),
        # model.save stores the script's own optimizer
        *((owner, "save_model") for owner in save_model_owners()),
    ]
    originals = [vars(owner)[name] for owner, name in owners]
    tf_amp.enable_mixed_precision_graph_rewrite(tf_keras.optimizers.SGD())  # "enable" holds too
    with activation.activated():
        assert all(
            vars(owner)[name] is not original
            for (owner, name), original in zip(owners, originals, strict=True)
        )
        assert tf_keras_fit.held("env") == len(owners)
    # the environment let go; enable_'s builders stay until disable_
    assert vars(tf_keras.Model)["compile"] is originals[0]
    assert tf_keras_fit.held() == 3
    tf_amp.disable_mixed_precision_graph_rewrite()
    assert [vars(owner)[name] for owner, name in owners] == originals


def test_a_lambda_callback_gives_a_jit_compiled_fit_its_host_checks() -> None:
    """The README's way for tf_keras's fit (LossScaleCallback is a Keras 3 callback)."""
    x, y = np.full((32, 1), np.inf, "float32"), np.ones((32, 1), "float32")
    inputs = tf_keras.Input((1,))
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(inputs))
    opt = tf_amp.LossScaleOptimizer(
        tf_keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=4.0), max_consecutive_skips=3
    )
    model.compile(optimizer=opt, loss="mse", jit_compile=True)
    check = tf_keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_: opt.check_skips())
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 consecutive steps"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[check])
    assert int(opt.skipped_steps) == 3  # tf_keras runs batch callbacks in step, not later


def test_a_module_with_an_xla_step_exports_and_checkpoints_keep_their_keys(tmp_path):
    """As for the Keras 3 wrapper: the counts an XLA step keeps are exported, not checkpointed."""
    w = tf.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1), max_consecutive_skips=5)
    trainer = module_with_an_xla_step(opt, w, lambda o, g, v: o.apply_gradients([(g, v)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradients of an unscaled loss: on purpose
        trainer.train(tf.constant([np.inf]))
    tf.saved_model.save(trainer, str(tmp_path / "saved"))
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "c"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("current_loss_scale" in name for name in names)
    assert not any("floor_events" in name for name in names)


def test_check_skips_gives_an_xla_steps_floor_checks_on_the_host(capfd):
    """A step compiled with XLA has no in-graph alarm; check_skips() says it and raises."""
    w = tf.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(
        tf_keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=2.0), max_consecutive_skips=4
    )

    @tf.function(jit_compile=True)
    def step(gradient: tf.Tensor) -> None:
        opt.apply_gradients([(gradient, w)])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradients of an unscaled loss: on purpose
        for _ in range(3):  # 2 -> 1 (the floor), then two skips at the floor
            step(tf.constant([np.inf]))
            opt.check_skips()
        err = capfd.readouterr().err
        assert "fell to its floor 1 after 1 steps" in err
        assert "at its floor 1 and 2 steps in a row" in err
        step(tf.constant([np.inf]))
        with pytest.raises(tf.errors.InvalidArgumentError, match="4 consecutive steps"):
            opt.check_skips()
    assert w.numpy()[0] == 1.0


@pytest.mark.parametrize("target", ["float16"])
def test_a_tf_keras_loss_on_probabilities_stays_float32(target: str, monkeypatch) -> None:
    # tf_keras's binary_crossentropy clips probabilities to [1e-7, 1 - 1e-7]; painted half,
    # float16 skipped every step from the fourth epoch on, stuck at twice float32's loss.
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", target)
    rng = np.random.RandomState(0)
    x = rng.randn(256, 4).astype("float32")
    y = (x[:, :1] > 0).astype("float32")

    def train(optimizer: Any) -> tuple[list[float], Any]:
        tf_keras.utils.set_random_seed(0)
        inputs = tf_keras.Input((4,))
        hidden = tf_keras.layers.Dense(16, activation="relu")(inputs)
        probabilities = tf_keras.layers.Dense(1, activation="sigmoid")(hidden)
        # A layer after the sigmoid: tf_keras cannot take the logits back, the clip is used.
        model = tf_keras.Model(inputs, tf_keras.layers.Reshape((1,))(probabilities))
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        return model.fit(x, y, batch_size=32, epochs=6, verbose=0).history["loss"], model

    float32_losses, _ = train(tf_keras.optimizers.Adam(5e-2))
    amp_losses, model = train(
        tf_amp.enable_mixed_precision_graph_rewrite(tf_keras.optimizers.Adam(5e-2)))
    step = tf_keras_fit.rewritten_functions(model)["train"].rewritten_concrete_functions()[0]
    half = tf.as_dtype(target).as_datatype_enum
    graph_def = step.graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    half_ops = {n.op for n in nodes if n.attr["T"].type == half}
    assert "MatMul" in half_ops, half_ops  # the model itself still runs in half
    assert np.isfinite(amp_losses).all(), amp_losses
    np.testing.assert_allclose(amp_losses[-1], float32_losses[-1], atol=0.005)


def test_a_tf_keras_model_whose_own_policy_computes_in_float16_gets_loss_scaling(monkeypatch):
    """As for Keras 3: tf_keras's compile scales for a mixed_float16 model unless given a
    wrapper, and enable_'s wrapper under a bfloat16 target did not scale."""
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "bfloat16")
    x = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)

    class Net(tf_keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = tf_keras.layers.Dense(16, dtype=self._dtype_policy)
            self.out = tf_keras.layers.Dense(1, dtype=self._dtype_policy)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    model = Net(dtype="mixed_float16")
    model(x[:1])
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(tf_keras.optimizers.SGD(0.1))
        assert not opt.enabled
        model.compile(opt, loss="mse")
        model.fit(x, x[:, :1], batch_size=32, epochs=1, verbose=0)
        assert opt.enabled and float(opt.loss_scale) >= 2.0**14  # scaled (one halving: NaN-free)
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
